"""Every Lua script voxroom sends, each written once.

Scripts run whole inside Redis, so each is atomic with the checks it makes (the ownership fence,
the turn fence, the dedupe). Where the two Redis modes differ, the difference is a small named
piece of Lua in the same file as the script that uses it (``room.py``'s fences, ``say.py``'s
tails): the single-instance and the Cluster implementations of the store each pick theirs.
Scripts go out with ``EVAL``, never ``EVALSHA``: Redis caches the compiled script by its digest
either way, and a Redis that restarted empty needs no ``NOSCRIPT`` round trip.
"""
