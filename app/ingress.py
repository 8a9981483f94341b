"""Accepting an utterance: one atomic Redis script per ``say``.

The script dedupes by (sender, client seq), refuses when the room already has too many
utterances waiting (back-pressure: the client gets ``busy`` with ``retry_after_ms``), gives the
utterance the room's next sequence number, records the room's voice change, and appends the
utterance to both the room's log (readable with ``redis-cli``) and the shared job stream. Doing it
in one script means two gateways can never hand out the same number or enqueue out of order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

from redis.asyncio import Redis

from voxroom import keys
from voxroom.autopipe import AutoPipeline

_SAY = """
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if tonumber(ARGV[2]) <= last then return {0, last} end
local seq = tonumber(redis.call('GET', KEYS[2]) or '0')
local nxt = tonumber(redis.call('HGET', KEYS[5], 'next') or '1')
if seq - nxt + 1 >= tonumber(ARGV[9]) then return {-1, seq - nxt + 1} end
seq = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('EXPIRE', KEYS[1], 86400)
local prev = redis.call('HGET', KEYS[5], 'voice') or ARGV[4]
redis.call('HSET', KEYS[5], 'voice', ARGV[4])
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'seq', seq, 'text', ARGV[3], 'voice', ARGV[4],
           'sender', ARGV[1], 'client_seq', ARGV[2], 'time', ARGV[5])
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'room', ARGV[8], 'seq', seq, 'text', ARGV[3],
           'voice', ARGV[4], 'prev_voice', prev, 'sender', ARGV[1], 'time', ARGV[5])
redis.call('ZADD', KEYS[6], ARGV[5], ARGV[8])
return {1, seq}
"""


@dataclass(frozen=True, slots=True)
class SayOutcome:
    status: Literal["accepted", "duplicate", "busy"]
    utterance: int
    """The room seq given (accepted), the last client seq seen (duplicate), or the backlog (busy)."""


class Ingress:
    def __init__(self, redis: Redis, *, utterance_maxlen: int = 1000, jobs_maxlen: int = 100_000,
                 max_pending_per_room: int = 16) -> None:
        # Lines that many rooms send in the same loop turn share one round trip (voxroom/autopipe.py).
        # EVAL, not EVALSHA: Redis caches the compiled script by digest, and a Redis restarted
        # empty needs no NOSCRIPT retry.
        self._auto = AutoPipeline(redis)
        self.utterance_maxlen = utterance_maxlen
        self.jobs_maxlen = jobs_maxlen
        self.max_pending = max_pending_per_room

    async def aclose(self) -> None:
        await self._auto.aclose()

    async def say(self, room: str, sender: str, client_seq: int, text: str, voice: str) -> SayOutcome:
        now_ms = int(time.time() * 1000)
        status, value = await self._auto.call(
            "EVAL", _SAY, 6, keys.room_senders(room), keys.room_seq(room), keys.room_utterances(room), keys.JOBS,
            keys.room_state(room), keys.ROOMS,
            sender, client_seq, text, voice, now_ms, self.utterance_maxlen, self.jobs_maxlen, room, self.max_pending)
        kind: Literal["accepted", "duplicate", "busy"] = (
            "accepted" if status == 1 else "duplicate" if status == 0 else "busy")
        return SayOutcome(kind, int(value))
