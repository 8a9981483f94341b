"""Redis, behind one interface (``interface.py``) with two implementations: one Redis
(``single/``) and a Redis Cluster (``cluster/``), chosen once where the store is opened
(``opening.py``). Also here: the key names (``keys.py``), the scripts (``lua/``), automatic
pipelining (``autopipe.py``), the one class of "Redis cannot serve us now" (``backoff.py``), and
what is written once for both modes (``jobs.py``, ``claims.py``, ``inspection.py``)."""
