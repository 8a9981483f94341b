"""``WAIT`` for replicas before a line is answered ``accepted`` (``VOXROOM_REDIS_WAIT_REPLICAS``):
one replica round trip per loop turn, on the connection the line's say script went out on."""

from __future__ import annotations

from redis.exceptions import ResponseError

from voxroom.errors import NotReplicated
from voxroom.store import keys
from voxroom.store.autopipe import AutoPipeline
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.interface import SayOutcome


def check_wait(replicas: int, timeout_ms: int, pipeline_timeout_s: float) -> None:
    """Refuse a ``WAIT`` configuration at start (``ValueError``): ``timeout_ms`` 0 would make
    ``WAIT`` block until the replicas answer, forever with one stopped; a timeout as long as the
    autopipeline's own reply timeout would make a slow replica look like a dead primary (every
    command in flight on the connection failed)."""
    if replicas < 0:
        raise ValueError(f"redis_wait_replicas must be 0 (off) or more, not {replicas}")
    if replicas and not 1 <= timeout_ms < pipeline_timeout_s * 1000:
        raise ValueError(f"redis_wait_timeout_ms must be from 1 to {int(pipeline_timeout_s * 1000) - 1}, "
                         f"not {timeout_ms}")


async def wait_replicas(pipe: AutoPipeline, room: str, outcome: SayOutcome, *, replicas: int, timeout_ms: int,
                        room_ttl_s: int) -> None:
    """Return once ``replicas`` replicas have what ``outcome`` answers for; raise
    :class:`NotReplicated` when ``WAIT`` gave up first. ``pipe``: the autopipeline of the node that
    ran the say script. Nothing to wait for with ``replicas`` 0 or a ``busy`` (no write).

    ``WAIT`` counts the replication offset of the connection that calls it, as of that
    connection's last write. After an accept on the pipeline's one connection that is the line's
    own write (or a later one). That connection carries every line of the node, and a ``WAIT``
    holds it for a replica round trip (Redis runs nothing else of a blocked connection): the says
    of one loop turn go out together, their ``WAIT`` commands together after the replies, so the
    first ``WAIT`` covers every line before it and the others return at once. One replica round
    trip per loop turn, where ``EVAL, WAIT`` pipelined per line would pay one per line. Left
    open: a connection lost after a line's reply was read and before its ``WAIT`` went out (the
    pipeline reconnects) would confirm the line unchecked, as ``WAIT`` on a connection without
    writes returns at once.

    A ``duplicate`` wrote nothing, and the line it answers for may have been written on another
    connection (another gateway: a client that reconnected elsewhere); so may an accept whose
    batch and ``WAIT`` went through different pooled connections (TLS: ``pipe.one_connection`` is
    false, its batches go through redis-py's pool).
    Then an ``EXPIRE`` (of the room's senders key, as any say refreshes it) goes first, in the
    same group and so on the same connection: a write there, so the ``WAIT`` behind it covers
    everything the primary had by then, that line included. It costs a replica round trip per
    line (the next ``EXPIRE`` moves the offset past what the ``WAIT`` before it waited for)."""
    if replicas <= 0 or outcome.status in ("busy", "too_old"):
        return
    try:
        if outcome.status == "duplicate" or not pipe.one_connection:
            _, acked = await pipe.group([("EXPIRE", keys.room_senders(room), room_ttl_s),
                                         ("WAIT", replicas, timeout_ms)])
        else:
            acked = await pipe.call("WAIT", replicas, timeout_ms)
    except ResponseError as exc:
        if isinstance(exc, REDIS_DOWN):
            raise
        # An error reply that is not "Redis down" (a slot moved away between the say and its
        # WAIT: the EXPIRE answered MOVED): nothing confirmed, and nothing changed for the line.
        # The client resends, as after a timeout.
        raise NotReplicated(f"room {room}: could not confirm the line on a replica: {exc}") from exc
    if int(acked) < replicas:
        what = f"line {outcome.utterance}" if outcome.status == "accepted" else "the line"
        raise NotReplicated(f"room {room}: {what} is in the primary, but {int(acked)} of {replicas} replicas "
                            f"confirmed it within {timeout_ms} ms")
