"""Accepting a line on one Redis: one atomic script per ``say`` (voxroom/store/lua/say.py), which
also writes the job to ``vx:jobs``, so two gateways never hand out one number twice or enqueue out
of order.

It also keeps the room's lifetime: every key of the room gets ``EXPIRE room_idle_ttl_s`` again, so
a room nobody speaks in disappears from Redis that long after its last line (the worker refreshes
``:out`` and ``:state`` as it publishes), and ``vx:rooms`` entries older than that are removed, a
bounded number per call (docs/operations.md, "Room lifecycle").
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Literal

from voxroom.store import cancels, keys, lines
from voxroom.store.autopipe import AutoPipeline
from voxroom.store.interface import CancelRequest, IngressOptions, SayOutcome
from voxroom.store.lua import say
from voxroom.store.replicas import check_wait, wait_replicas
from voxroom.store.single.jobs import SCRIPTS
from voxroom.voices import line_lexicon

STALE_ROOMS_PER_SAY = 64
"""``vx:rooms`` entries past the idle TTL removed by one ``say`` at most: the script's cost stays
bounded, and since one ``say`` adds at most one room, stale entries go faster than they come."""


class SingleIngress:
    """:class:`voxroom.store.interface.Ingress` on one Redis. ``pipe`` (owned: closed by
    :meth:`aclose`): an autopipeline with ``max_hold_s=SAY_HOLD_S``; lines that many rooms send in
    one loop turn share a round trip, but no line waits more than that for later ones. Raises
    ``ValueError`` for ``WAIT`` options :func:`check_wait` refuses."""

    def __init__(self, pipe: AutoPipeline, options: IngressOptions) -> None:
        check_wait(options.wait_replicas, options.wait_timeout_ms, pipe.timeout_s)
        self._pipe = pipe
        self.options = options

    async def aclose(self) -> None:
        await self._pipe.aclose()

    async def say(self, room: str, sender: str, client_seq: int, text: str, voice: str, *,
                  lexicon: Mapping[str, str] | None = None, to: Sequence[str] = (),
                  open_line: bool = False) -> SayOutcome:
        o = self.options
        now_ms = int(time.time() * 1000)
        status, value = await self._pipe.call(
            "EVAL", say.SINGLE, 8, keys.room_senders(room), keys.room_seq(room), keys.room_utterances(room),
            keys.JOBS, keys.room_state(room), keys.ROOMS, keys.room_output(room),
            keys.open_line(room, sender, client_seq),
            sender, client_seq, text, voice, now_ms, o.utterance_maxlen, o.jobs_maxlen, room, o.max_pending_per_room,
            o.room_idle_ttl_s, now_ms - o.room_idle_ttl_s * 1000, STALE_ROOMS_PER_SAY, o.switch_lines,
            line_lexicon.encode(lexicon or {}), " ".join(to), "1" if open_line else "", len(text))
        kind: Literal["accepted", "duplicate", "busy", "too_old"] = (
            "accepted" if status == 1 else "duplicate" if status == 0 else "too_old" if status == -2 else "busy")
        outcome = SayOutcome(kind, int(value))
        await wait_replicas(self._pipe, room, outcome, replicas=o.wait_replicas, timeout_ms=o.wait_timeout_ms,
                            room_ttl_s=o.room_idle_ttl_s)
        return outcome

    async def cancel(self, room: str, request: CancelRequest) -> list[int]:
        return await cancels.cancel(self._pipe, SCRIPTS.cancel, room, request)

    async def append(self, room: str, sender: str, client_seq: int, part: int, text: str, *,
                     final: bool) -> int:
        return await lines.append(self._pipe, SCRIPTS.append, room, sender, client_seq, part, text, final=final,
                                  ttl_s=self.options.room_idle_ttl_s)

    async def flush(self, room: str, sender: str, client_seq: int) -> int:
        return await lines.flush(self._pipe, SCRIPTS.flush, room, sender, client_seq,
                                 ttl_s=self.options.room_idle_ttl_s)
