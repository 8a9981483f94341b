"""Accepting an utterance: one atomic Redis script per ``say``.

The script dedupes by (sender, client seq), refuses when the room already has too many
utterances waiting (back-pressure: the client gets ``busy`` with ``retry_after_ms``), gives the
utterance the room's next sequence number, records the room's voice change (and numbers the lines
of a voice switch spread over several lines), and appends the utterance to both the room's log
(readable with ``redis-cli``) and the shared job stream. Doing it in one script means two gateways
can never hand out the same number or enqueue out of order.

It also keeps the room's lifetime: every key of the room gets ``EXPIRE room_idle_ttl_s`` again, so
a room nobody speaks in disappears from Redis that long after its last line (the worker refreshes
``:out`` and ``:state`` as it publishes), and ``vx:rooms`` entries older than that are removed, a
bounded number per call (docs/operations.md, "Room lifecycle").
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from redis.asyncio import Redis
from redis.asyncio.connection import SSLConnection
from redis.exceptions import ResponseError

from voxroom.errors import NotReplicated
from voxroom.runtime.settings import Settings
from voxroom.store import keys
from voxroom.store.autopipe import AutoPipeline, Commands
from voxroom.store.backoff import REDIS_DOWN
from voxroom.voices import line_lexicon

if TYPE_CHECKING:
    from app.ingress.handoff import HandOff

SAY_HOLD_S = 0.0005
"""The longest a ``say`` waits in its loop turn for later ones to share its write. A burst of 100
rooms' lines takes the gateway several milliseconds to handle in one turn; held to the turn's end
they reached Redis's job stream 2 to 5 ms later at the median (docs/benchmarks.md, "The burst
again")."""

STALE_ROOMS_PER_SAY = 64
"""``vx:rooms`` entries past the idle TTL removed by one ``say`` at most: the script's cost stays
bounded, and since one ``say`` adds at most one room, stale entries go faster than they come."""

# KEYS: 1 senders, 2 seq, 3 utt, 4 jobs, 5 state, 6 rooms, 7 out.
# ARGV: 1 sender, 2 client seq, 3 text, 4 voice, 5 now ms, 6 utt maxlen, 7 jobs maxlen, 8 room,
#       9 max pending, 10 idle ttl s, 11 stale cutoff ms, 12 stale entries per call, 13 switch lines,
#       14 the line's own lexicon as JSON ('' for none).
_SAY_BODY = """
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if tonumber(ARGV[2]) <= last then return {0, last} end
local nxt = tonumber(redis.call('HGET', KEYS[5], 'next') or '1')
local seq = redis.call('GET', KEYS[2])
if not seq then
  seq = nxt - 1
elseif redis.call('HEXISTS', KEYS[5], 'voice') == 0 then
  seq = tonumber(seq)
  nxt = seq + 1
  redis.call('HSET', KEYS[5], 'next', nxt)
else
  seq = tonumber(seq)
end
if seq - nxt + 1 >= tonumber(ARGV[9]) then return {-1, seq - nxt + 1} end
seq = seq + 1
redis.call('SET', KEYS[2], seq, 'EX', ARGV[10])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
local prev = redis.call('HGET', KEYS[5], 'voice') or ARGV[4]
redis.call('HSET', KEYS[5], 'voice', ARGV[4])
local from = redis.call('HGET', KEYS[5], 'switch_from')
local line = tonumber(redis.call('HGET', KEYS[5], 'switch_line') or '0')
local lines = tonumber(redis.call('HGET', KEYS[5], 'switch_lines') or ARGV[13])
if prev ~= ARGV[4] then
  if from == ARGV[4] and line > 0 and line < lines then
    line = lines - line
  else
    line = 0
    lines = tonumber(ARGV[13])
  end
  from = prev
end
local extra = {}
if from then
  extra = {'switch_from', from, 'switch_line', line, 'switch_lines', lines}
  if line + 1 >= lines then
    redis.call('HDEL', KEYS[5], 'switch_from', 'switch_line', 'switch_lines')
  else
    redis.call('HSET', KEYS[5], 'switch_from', from, 'switch_line', line + 1, 'switch_lines', lines)
  end
end
if ARGV[14] ~= '' then
  extra[#extra + 1] = 'lexicon'
  extra[#extra + 1] = ARGV[14]
end
"""
"""Numbering, dedupe, back-pressure and the voice switch: shared with the cluster's ``say``
(app/ingress/handoff.py), which differs only in what it writes after."""
_SAY = _SAY_BODY + """\
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'seq', seq, 'text', ARGV[3], 'voice', ARGV[4],
           'sender', ARGV[1], 'client_seq', ARGV[2], 'time', ARGV[5])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'room', ARGV[8], 'seq', seq, 'text', ARGV[3],
           'voice', ARGV[4], 'prev_voice', prev, 'sender', ARGV[1], 'time', ARGV[5], unpack(extra))
redis.call('EXPIRE', KEYS[1], ARGV[10])
redis.call('EXPIRE', KEYS[3], ARGV[10])
redis.call('EXPIRE', KEYS[5], ARGV[10])
redis.call('EXPIRE', KEYS[7], ARGV[10])
redis.call('ZADD', KEYS[6], ARGV[5], ARGV[8])
local stale = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', '(' .. ARGV[11], 'LIMIT', 0, ARGV[12])
if #stale > 0 then redis.call('ZREM', KEYS[6], unpack(stale)) end
redis.call('EXPIRE', KEYS[6], ARGV[10])
return {1, seq}
"""
# Why the script reads the way it does:
# - ``:seq`` missing while ``:state`` is not: ``:state`` outlives ``:seq`` when the worker's last
#   publish came after the last ``say`` (it refreshes ``:state``, not ``:seq``). Numbering then
#   continues where playback stands (``next - 1``), never below it, or the new line would wait
#   forever behind a ``next`` it can never reach.
# - ``:state`` missing while ``:seq`` is not (every accepted line writes ``voice``, so a ``:state``
#   without it was lost: evicted under ``maxmemory``, see docker-compose.yml): the room starts
#   over from its last number (``next = seq + 1``; lines still pending from before are dropped as
#   stale by the worker) instead of answering ``busy`` until ``:seq`` expires.
# - ``EXPIRE`` on ``:out`` before the worker ever wrote it is a no-op; the worker refreshes it.
# - ``vx:rooms`` itself expires when no line was accepted anywhere for the TTL: then every entry
#   in it is stale, and no later ``say`` may ever come to remove them.
# - Voice switches span lines: a switch's progress (``switch_from``, the next ``switch_line``,
#   ``switch_lines``) lives in ``:state`` until its last line is handed out, and each of its
#   lines carries the same three fields in ``vx:jobs`` (the worker blends line k of L over
#   ``k/L..(k+1)/L``). Numbered here, in room order, because a room's lines may be synthesized
#   at once on different workers: none of them could read "how far has the switch got" then.
#   ``prev_voice`` stays for workers from before (they switch within the line).
# - A switch while another runs starts from the voice the room was moving to (the sound jumps
#   from the blend reached to the first step of the new path), except a switch back to the voice
#   the running switch came from: that path is the same one reversed, so it goes on from where
#   it stands (line ``lines - line``) with no jump at all.
# - A line's own lexicon (``say``'s ``lexicon``, voxroom/voices/line_lexicon.py) rides in ``vx:jobs`` as
#   one JSON field, only when given: the worker that synthesizes the line needs it, the room's
#   log does not. A worker from before ignores the field and speaks the line without it.


def one_connection(redis: Redis) -> bool:
    """Whether an :class:`AutoPipeline` over ``redis`` sends everything on one connection, as it
    decides: TLS batches go through redis-py's pool instead (see :func:`wait_replicas`)."""
    return not issubclass(redis.connection_pool.connection_class, SSLConnection)


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


async def wait_replicas(pipe: Commands, room: str, outcome: SayOutcome, *, replicas: int, timeout_ms: int,
                        room_ttl_s: int, one_connection: bool = True) -> None:
    """Return once ``replicas`` replicas have what ``outcome`` answers for; raise
    :class:`NotReplicated` when ``WAIT`` gave up first. ``pipe``: the autopipeline of the node that
    ran the say script. Nothing to wait for with ``replicas`` 0 or a ``busy`` (no write).
    ``one_connection``: ``pipe`` sends everything on one connection (``False`` for TLS, where its
    batches go through redis-py's pool).

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
    batch and ``WAIT`` went through different pooled connections (``one_connection=False``).
    Then an ``EXPIRE`` (of the room's senders key, as any say refreshes it) goes first, in the
    same group and so on the same connection: a write there, so the ``WAIT`` behind it covers
    everything the primary had by then, that line included. It costs a replica round trip per
    line (the next ``EXPIRE`` moves the offset past what the ``WAIT`` before it waited for)."""
    if replicas <= 0 or outcome.status == "busy":
        return
    try:
        if outcome.status == "duplicate" or not one_connection:
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


def _default_idle_ttl_s() -> int:
    return Settings().room_idle_ttl_s


@dataclass(frozen=True, slots=True)
class SayOutcome:
    status: Literal["accepted", "duplicate", "busy"]
    utterance: int
    """The room seq given (accepted), the last client seq seen (duplicate), or the backlog (busy)."""


class Ingress:
    def __init__(self, redis: Redis, *, utterance_maxlen: int = 1000, jobs_maxlen: int = 100_000,
                 max_pending_per_room: int = 16, room_idle_ttl_s: int | None = None,
                 switch_lines: int | None = None, handoff: HandOff | None = None, wait_replicas: int = 0,
                 wait_timeout_ms: int = 500) -> None:
        """``room_idle_ttl_s``: a room's keys expire this long after its last accepted line
        (``None``: the :class:`Settings` default, 3600). ``switch_lines``: lines a voice switch
        is spread over (``None``: the :class:`Settings` default of ``chattts_switch_lines``; 1: the
        switch happens within the line that makes it). Raises ``ValueError`` below 1.
        ``handoff``: Redis Cluster only (app/ingress/handoff.py): accept in the room's slot, then hand the
        line to its job shard; ``None`` (one Redis instance): the one script below.
        ``wait_replicas`` (``VOXROOM_REDIS_WAIT_REPLICAS``): answer ``accepted`` (and ``duplicate``)
        only once that many replicas confirmed the write (``WAIT``, ``wait_timeout_ms`` at most,
        else :class:`NotReplicated`); 0: as soon as the primary has it. On a cluster the hand-off
        waits (its own copy of these settings). Raises ``ValueError`` for values
        :func:`check_wait` refuses."""
        self.handoff = handoff
        # Lines that many rooms send in the same loop turn share one round trip (voxroom/store/autopipe.py),
        # but no line waits more than SAY_HOLD_S for later ones: in a burst of 100 rooms the
        # gateway handles each line in Python first, and Redis runs the first ones meanwhile.
        # EVAL, not EVALSHA: Redis caches the compiled script by digest, and a Redis restarted
        # empty needs no NOSCRIPT retry.
        self._auto = AutoPipeline(redis, max_hold_s=SAY_HOLD_S)
        self._one_connection = one_connection(redis)
        check_wait(wait_replicas, wait_timeout_ms, self._auto.timeout_s)
        self.wait_replicas = wait_replicas
        self.wait_timeout_ms = wait_timeout_ms
        self.utterance_maxlen = utterance_maxlen
        self.jobs_maxlen = jobs_maxlen
        self.max_pending = max_pending_per_room
        self.room_idle_ttl_s = _default_idle_ttl_s() if room_idle_ttl_s is None else room_idle_ttl_s
        if self.room_idle_ttl_s < 1:
            raise ValueError(f"room_idle_ttl_s must be at least 1 s, not {self.room_idle_ttl_s}")
        self.switch_lines = Settings().chattts_switch_lines if switch_lines is None else switch_lines
        if self.switch_lines < 1:
            raise ValueError(f"switch_lines must be at least 1, not {self.switch_lines}")

    async def aclose(self) -> None:
        await self._auto.aclose()

    async def say(self, room: str, sender: str, client_seq: int, text: str, voice: str, *,
                  lexicon: Mapping[str, str] | None = None) -> SayOutcome:
        """Store one line. ``lexicon``: the line's own respellings, already validated
        (``voxroom.voices.line_lexicon.parse``); ``None`` or empty: none."""
        now_ms = int(time.time() * 1000)
        stale_before_ms = now_ms - self.room_idle_ttl_s * 1000
        if self.handoff is not None:
            return await self.handoff.say_and_hand(room, [
                sender, client_seq, text, voice, now_ms, self.utterance_maxlen, self.jobs_maxlen, room,
                self.max_pending, self.room_idle_ttl_s, stale_before_ms, STALE_ROOMS_PER_SAY, self.switch_lines,
                line_lexicon.encode(lexicon or {})])
        status, value = await self._auto.call(
            "EVAL", _SAY, 7, keys.room_senders(room), keys.room_seq(room), keys.room_utterances(room), keys.JOBS,
            keys.room_state(room), keys.ROOMS, keys.room_output(room),
            sender, client_seq, text, voice, now_ms, self.utterance_maxlen, self.jobs_maxlen, room, self.max_pending,
            self.room_idle_ttl_s, stale_before_ms, STALE_ROOMS_PER_SAY, self.switch_lines,
            line_lexicon.encode(lexicon or {}))
        kind: Literal["accepted", "duplicate", "busy"] = (
            "accepted" if status == 1 else "duplicate" if status == 0 else "busy")
        outcome = SayOutcome(kind, int(value))
        await wait_replicas(self._auto, room, outcome, replicas=self.wait_replicas, timeout_ms=self.wait_timeout_ms,
                            room_ttl_s=self.room_idle_ttl_s, one_connection=self._one_connection)
        return outcome
