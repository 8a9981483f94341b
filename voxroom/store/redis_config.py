"""The Redis server settings voxroom needs beyond Redis's defaults, in one place.

``voxroom serve`` and the tests start Redis with :data:`SERVER_ARGS` (voxroom/store/server.py);
docker-compose.yml's ``redis`` service passes the same, and docs/operations.md asks the same of a
Redis that operators run ("Redis settings"). tests/ops/test_redis_memory.py checks all three agree.

``stream-node-max-bytes 65536`` (Redis's default: 4096). A room's output stream holds 40 ms slices,
two to an entry (about 3.9 KiB of PCM each, voxroom/wire/output_entries.py). With 4 KiB nodes every entry
takes a node of its own: a listpack just over 4 KiB (jemalloc rounds it up to its 5 KiB size class)
that also repeats the master entry's field names, plus a radix-tree node. A room's stream cost 1.26x
the PCM it held (1.53x with Opus copies). With 64 KiB nodes about 16 entries share one listpack, the
field names are written once per node and the rounding is spread over the node: 1.08x (Opus: 1.15x),
measured with bench/redis_memory.py and bench/stream_nodes.py (docs/benchmarks.md). Trimming
(``XADD … MINID ~``) drops whole nodes, so a room keeps at most one node (about 1.3 s of audio)
beyond its resume window.
"""

from __future__ import annotations

STREAM_NODE_MAX_BYTES = 65536

SERVER_ARGS: tuple[str, ...] = ("--stream-node-max-bytes", str(STREAM_NODE_MAX_BYTES))
"""redis-server command-line arguments (the same names as redis.conf directives)."""
