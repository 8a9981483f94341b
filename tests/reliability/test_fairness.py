"""Fairness across rooms over real processes (issue 14): a ``voxroom worker`` process with one
context and the synthetic engine, against a real redis-server. One room floods its backlog (16
lines, ``VOXROOM_MAX_PENDING_PER_ROOM``'s default), then 20 rooms send one line each, as the
gateway's ingress script writes them to ``vx:jobs``.

First come first served, the 20 rooms waited for all 16 syntheses of the flood (20 s here),
long after the flooding room's third line had begun to play. Fair, each single-line room's
first audio (its ``start`` entry) comes before the flooding room's second line starts: they wait
for the one line of the flood already taken when they came, and for no other (before the turn
numbers of ``workers/pool/line_queue.py``, the flood's second line went ahead of the rooms still waiting
once its first line's audio ran low). Judged by the order of the ``start`` entries in Redis (the
stream ids are Redis's clock), never by milliseconds.

The synthetic engine sleeps instead of computing, at a real-time factor of 0.2 here: a 5.5 s
line of the flood takes 1.15 s to make (with its 50 ms to first chunk), a 1.9 s single line
0.44 s. So the 20 single lines take 9 s to make, one after another, and the flood's first line
is nearly played (under a second of it left, as urgent as a room that waits) while about half of
them still wait: the moment its second line went ahead of them before.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from redis.asyncio import Redis

from tests.support.outputs import Out, add_jobs, problems, read_out
from tests.support.processes import start_worker
from voxroom.store.server import RedisServer

FLOOD = "The werewolves wake up and choose, in silence, who will not see the morning."  # about 6 s
SINGLE = "Good evening to all of you."  # 1.9 s
ROOMS = 20
ENV = {"VOXROOM_CACHE_SLOTS": "0", "VOXROOM_OPUS_BITRATE": "0", "VOXROOM_SYNTHETIC_TTFC_MS": "50",
       "VOXROOM_SYNTHETIC_RTF": "0.2"}




def stamp(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def start_of(entries: list[Out], seq: int) -> Out | None:
    return next((e for e in entries if e.kind == "start" and e.seq == seq), None)


async def test_single_line_rooms_start_before_a_flooding_rooms_second_line(own_redis: RedisServer, r: Redis,
                                                                          raw: Redis, tmp_path: Path) -> None:
    worker = start_worker(own_redis.url, tmp_path, engine="synthetic", contexts=1, name="fair", **ENV)
    try:
        await add_jobs(r, [("flood", FLOOD)] * 16)
        singles = [f"single-{i}" for i in range(ROOMS)]
        await add_jobs(r, [(room, SINGLE) for room in singles])

        deadline = time.monotonic() + 90
        while True:
            flood = await read_out(raw, "flood")
            got = {room: await read_out(raw, room) for room in singles}
            # Every single line whole (its end is in), and the flood's second line begun.
            if start_of(flood, 2) is not None and all(any(e.kind == "end" for e in out) for out in got.values()):
                break
            assert worker.alive(), worker.log_text()[-3000:]
            assert time.monotonic() < deadline, (
                f"flood starts {[e.seq for e in flood if e.kind == 'start']}, single rooms started "
                f"{sum(1 for out in got.values() if start_of(out, 1))}/{ROOMS}")
            await asyncio.sleep(0.1)

        second = stamp(next(e.entry_id for e in flood if e.kind == "start" and e.seq == 2))
        firsts = {room: stamp(next(e.entry_id for e in out if e.kind == "start")) for room, out in got.items()}
        late = [room for room, first in firsts.items() if first > second]
        assert late == [], f"{len(late)} of {ROOMS} single-line rooms started after the flood's second line"
        # And they were whole lines, not starts alone.
        for room in singles:
            assert problems(await read_out(raw, room), 1) == [], room
        assert problems([e for e in flood if e.seq <= 1], 1) == []
    finally:
        worker.stop()

