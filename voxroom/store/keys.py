"""Every Redis key voxroom uses, in one place.

Operators read these with ``redis-cli`` (see docs/operations.md). All keys share the ``vx:`` prefix
so that one ``SCAN MATCH vx:*`` shows everything voxroom owns.

The braces around ``{room}`` are literal: a room's keys carry its id as a Redis Cluster hash tag
(``vx:room:{lobby}:utt``), so every key of one room lies in one slot and each script that touches
a room still touches one slot (docs/cluster.md). Room ids cannot hold braces (``[A-Za-z0-9_-]``).
Quote them in a shell: ``redis-cli XRANGE 'vx:room:{lobby}:utt' - +``.

=====================================  ========  ====================================================
key                                    type      what
=====================================  ========  ====================================================
``vx:jobs``                            stream    work queue: one entry per utterance, consumer group
                                                 ``workers``; XACK after the audio is published
``vx:room:{room}:utt``                 stream    the room's utterance log (seq, text, voice, sender,
                                                 time), text fields only, ``MAXLEN ~``
``vx:room:{room}:out``                 stream    the room's output: ``start`` / ``chunk`` / ``end``
                                                 entries; audio only in the binary ``frame`` field
                                                 (and ``opus``, its Opus copy, while an Opus client
                                                 listens)
``vx:room:{room}:seq``                 string    last room-level utterance sequence number
``vx:room:{room}:state``               hash      ``next`` (seq allowed to play next), ``end_ms``
                                                 (room-clock time the last utterance ends),
                                                 ``voice`` (the room's current voice); while a
                                                 voice switch spreads over lines: ``switch_from``
                                                 (old voice), ``switch_line`` (the next line's
                                                 number in it), ``switch_lines`` (its length)
``vx:room:{room}:senders``             hash      sender id -> last client ``seq`` accepted (dedupe)
``vx:room:{room}:opus``                string    present (TTL 30 s, refreshed) while an Opus client
                                                 listens: workers add Opus copies only then
``vx:room:{room}:client:{id}``        string    claim on a self-chosen client id (owner), 15 s TTL
                                                 refreshed by the gateway holding it
``vx:room:{room}:line:{sender}:{seq}`` stream    an open line's pieces (``append``), one entry
                                                 each; room TTL, deleted when the line ends
``vx:rooms``                           zset      room -> last activity (ms); for ``voxroom rooms``;
                                                 entries past the idle TTL are removed by ``say``
``vx:worker:{id}``                     hash      worker heartbeat: engines, contexts, load (TTL)
``vx:gw:{id}:wake:{n}``                stream    private to one gateway reader: XADD wakes its
                                                 blocked XREAD when its room set changes
``vx:room:{room}:bell``                channel   Redis Cluster only, sharded pub/sub (not a key):
                                                 rung by the worker after each write to ``:out``
``vx:cache:{slot}``                    hash      audio cache, one entry per slot (``fp``, ``pcm``):
                                                 slot = fingerprint mod ``cache_slots``, with a TTL
=====================================  ========  ====================================================

A room's keys (``:utt``, ``:out``, ``:seq``, ``:state``, ``:senders``) expire
``VOXROOM_ROOM_IDLE_TTL_S`` (1 h) after its last activity: the ``say`` script refreshes them all
and the worker refreshes ``:out`` and ``:state`` when it publishes. Keys without a TTL (``vx:jobs``
above all) are never evicted under ``maxmemory-policy volatile-lru`` (docs/operations.md).

Rooms whose id starts with ``_api-`` are private to one ``POST /v1/audio/speech`` request: they
are deleted when it ends and are not room listings' business.
"""

from __future__ import annotations

import functools
import itertools

PREFIX = "vx"
JOBS = f"{PREFIX}:jobs"
JOBS_GROUP = "workers"
ROOMS = f"{PREFIX}:rooms"
WORKERS = f"{PREFIX}:workers"
"""zset: worker id -> time of its last heartbeat (ms). The directory reads it instead of a SCAN."""


def room_tag(room: str) -> str:
    """The hash tag of every key of ``room``: Redis Cluster hashes only what is inside the braces."""
    return "{" + room + "}"


def room_key(room: str, part: str) -> str:
    """``vx:room:{room}:part``. The named functions below spell the same in one f-string each
    (they are on the hot path of every line and slice)."""
    return room_prefix(room) + part


def room_prefix(room: str) -> str:
    """What every key of ``room`` starts with: ``vx:room:{room}:``."""
    return f"{PREFIX}:room:{room_tag(room)}:"


def room_pattern(room: str) -> str:
    """``SCAN MATCH`` pattern for every key of ``room`` (braces are not special in Redis globs;
    ``room`` may itself hold ``*``: ``room_pattern("_api-*")``)."""
    return room_prefix(room) + "*"


def room_of_key(key: str) -> str:
    """The room id of a room key (``vx:room:{lobby}:out`` -> ``lobby``). Raises ``ValueError`` for a
    key that is not a room's."""
    head = f"{PREFIX}:room:{{"
    close = key.find("}:", len(head))
    if not key.startswith(head) or close < 0:
        raise ValueError(f"not a room key: {key!r}")
    return key[len(head):close]


def room_utterances(room: str) -> str:
    return f"{PREFIX}:room:{{{room}}}:utt"


def room_output(room: str) -> str:
    return f"{PREFIX}:room:{{{room}}}:out"


def room_bell(room: str) -> str:
    """The room's doorbell on a Redis Cluster: a sharded pub/sub channel, not a key (nothing to
    expire). The worker's scripts that append to ``:out`` ``SPUBLISH`` it (same hash tag, so same
    slot and node); a gateway ``SSUBSCRIBE``s it while it has listeners in the room
    (``voxroom/store/cluster/bells.py``). Unused on one Redis."""
    return f"{PREFIX}:room:{{{room}}}:bell"


def room_seq(room: str) -> str:
    return f"{PREFIX}:room:{{{room}}}:seq"


def room_state(room: str) -> str:
    return f"{PREFIX}:room:{{{room}}}:state"


def room_opus_demand(room: str) -> str:
    """Set (with a short TTL, refreshed) while some gateway has an Opus client in the room: workers
    encode Opus only for rooms that want it."""
    return f"{PREFIX}:room:{{{room}}}:opus"


def room_senders(room: str) -> str:
    return f"{PREFIX}:room:{{{room}}}:senders"


def open_line(room: str, sender: str, client_seq: int) -> str:
    """An open line's pieces (``say`` with ``open``, then ``append``/``flush``): a stream, one
    entry per piece (``part``, ``text``, ``offset``, ``end``; ``final`` on the one that closes the
    line; ``flush`` on a flush). Named by its sender and ``say`` seq, which every ``append``
    carries; room TTL, deleted by the worker when the line ends."""
    return f"{PREFIX}:room:{{{room}}}:line:{sender}:{client_seq}"


def worker_heartbeat(worker_id: str) -> str:
    return f"{PREFIX}:worker:{worker_id}"


def worker_pattern() -> str:
    return f"{PREFIX}:worker:*"


def worker_wake(worker_id: str) -> str:
    """Private to one worker's stream watcher (``voxroom/store/single/watcher.py``): an XADD wakes its blocked
    XREAD when a room joins it. Not under ``vx:worker:`` (heartbeats only)."""
    return f"{PREFIX}:wake:worker:{worker_id}"


def gateway_wake(gateway_id: str, reader: int | str) -> str:
    """A gateway's private wake streams: one per hub reader (``0``, ``1``...) and ``api``, its
    stream watcher's (``voxroom/store/single/watcher.py``, the speech API's waits)."""
    return f"{PREFIX}:gw:{gateway_id}:wake:{reader}"


PRIVATE_ROOM_PREFIX = "_api-"


def cache_slot(slot: int) -> str:
    return f"{PREFIX}:cache:{slot}"


def room_client_claim(room: str, client: str) -> str:
    """string (owner: gateway id and connection serial), 15 s TTL refreshed by the gateway holding
    it, deleted when its connection ends: a self-chosen client id in use in the room
    (app/room/identity.py)."""
    return f"{PREFIX}:room:{{{room}}}:client:{client}"


# -- Redis Cluster: job shards and room index shards (docs/cluster.md, "Jobs without a cross-slot
# write"). Used only when the gateway and the worker run on a cluster; a single instance keeps
# ``vx:jobs`` and ``vx:rooms``.
#
# Placed by the room's own hash slot: shard ``k`` of ``n`` holds the rooms whose slot lies in the
# k-th n-th of the 16384 slots, and its keys carry a hash tag chosen to fall in that same range
# (``j3``, or ``j3.5`` where ``j3`` hashes elsewhere). A cluster's primaries hold contiguous slot
# ranges (``redis-cli --cluster create`` makes them so), so a room's job shard and index shard
# lie on the room's own primary: one primary failing refuses only the rooms it holds
# (docs/cluster.md, "Failover"). The rooms of a slot at the very edge of a primary's range may
# have their shard on the neighbour (one slot of 16384 per edge, with ``job_shards`` a multiple of
# the primaries).

SLOTS = 16384


def room_slot(room: str) -> int:
    """The Redis Cluster hash slot of every key of ``room`` (CRC16 XMODEM of its hash tag)."""
    import binascii

    return binascii.crc_hqx(room.encode(), 0) % SLOTS


def shard_of(room: str, shards: int) -> int:
    """The shard of ``room`` among ``shards``: the part of the slot range its slot lies in."""
    return room_slot(room) * shards // SLOTS


@functools.lru_cache(maxsize=1024)
def shard_tag(prefix: str, shard: int, shards: int) -> str:
    """The hash tag of shard ``shard`` of ``shards``: ``<prefix><shard>``, or the first
    ``<prefix><shard>.<n>`` whose slot lies in the shard's own range of room slots."""
    import binascii

    low, high = -(-shard * SLOTS // shards), -(-(shard + 1) * SLOTS // shards)
    for n in itertools.count():
        tag = f"{prefix}{shard}" if n == 0 else f"{prefix}{shard}.{n}"
        if low <= binascii.crc_hqx(tag.encode(), 0) % SLOTS < high:
            return tag
    raise AssertionError("unreachable")


def job_shard(shard: int, shards: int) -> str:
    """stream: one of the job shards (``vx:jobs:{j3}``, the tag as :func:`shard_tag`), consumer
    group ``workers``; replaces ``vx:jobs`` on a cluster. A room's lines all go to one shard (its
    ``shard`` in ``:state``)."""
    return f"{PREFIX}:jobs:{{{shard_tag('j', shard, shards)}}}"


def job_shard_handed(shard: int, shards: int) -> str:
    """hash: room -> ``epoch:seq``, the highest line of the room added to the shard (the hand-off's
    high-water mark, in the shard's slot)."""
    return f"{job_shard(shard, shards)}:handed"


def job_shard_handed_at(shard: int, shards: int) -> str:
    """zset: room -> time (ms) of its last hand-off to the shard; the sweeper drops the
    high-water marks of rooms idle past the room TTL."""
    return f"{job_shard(shard, shards)}:handed_at"


def rooms_shard(shard: int, shards: int) -> str:
    """zset: room -> last activity (ms), the rooms of one index shard (``vx:rooms:{r3}``, the tag as
    :func:`shard_tag`): what ``vx:rooms`` is on a cluster, and where the sweeper finds rooms."""
    return f"{PREFIX}:rooms:{{{shard_tag('r', shard, shards)}}}"


def room_sweep_lease(room: str) -> str:
    """string (gateway id), short TTL: the gateway sweeping the room's hand-offs now."""
    return f"{PREFIX}:room:{{{room}}}:sweep"
