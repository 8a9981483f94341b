"""How fast a ``cancel`` silences a room (issue 30), with 1, 10 and 100 rooms speaking at once.

    .venv/bin/python bench/cancel.py [--rooms 1,10,100] [--after-ms 1500]

Real processes: a private redis-server, one worker (offline voices, espeak-ng, cache off, two
contexts), one gateway. Every room has one client that says a long line (about 10 s); once the
line has played ``--after-ms`` on the room clock (plus a random 0-80 ms, the phase of the slice
pairs' cycle), the client sends ``cancel`` for it. Measured per
room, on the room clock (ms since the epoch, the server's clock: this machine's, as the bench
runs on it):

- **silent after**: the end of the last slice the room got (its ``pts`` + 40 ms) minus the moment
  the cancel left the client (about when it reached the gateway: loopback). It counts the slices
  already published ahead of their play time (the lead, 120 ms, and one slice pair), which the
  cancel cannot call back. Goal of the issue: p95 <= 250 ms with 100 rooms speaking.
- **cut short by**: the line's scheduled end (its first slice's ``pts`` + the uncut line's length,
  measured once in the same run) minus where it stopped: how much of the line was not heard.
- **whole**: rooms where the ``end`` came ``cancelled``, its ``chunks`` equal the slices received
  (numbered 0..chunks-1, none missing, none after the cut), and the last slice is the faded one.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store.server import RedisServer
from voxroom.wire.protocol import SLICE_MS

VOICE = "en-espeak"
LINE = ("The night is long and the village sleeps, while somewhere beyond the mill the wolves are "
        "gathering, and the seer turns in her bed, dreaming of a face she cannot quite recall.")


@dataclass
class Cut:
    silent_after_ms: float
    cut_short_ms: float
    whole: bool


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def uncut_length_ms(port: int) -> float:
    async with RoomClient(port, "bench-cancel-baseline") as client:
        await client.say(LINE, VOICE)
        end = (await client.wait_ends(1, 60))[0]
        return float(end["duration_ms"])


async def one_room(port: int, room: str, after_ms: float, length_ms: float) -> Cut:
    async with RoomClient(port, room) as client:
        seq = await client.say(LINE, VOICE)
        await client.wait_for(lambda g: any(m["seq"] == seq for m in g.of("accepted")), 60)
        utterance = next(m["utterance"] for m in client.got.of("accepted") if m["seq"] == seq)
        await client.wait_for(lambda g: bool(g.frames_of(utterance)), 60)
        first_pts_ms = client.got.frames_of(utterance)[0].pts_us / 1000
        # Until the line has played ``after_ms`` on the room clock, plus a random part of a slice
        # pair: slices leave in pairs every 80 ms, and a cancel at a fixed offset from the first
        # slice would always land at the same phase of that cycle (always 180 ms, an artefact).
        at_ms = first_pts_ms + after_ms + random.uniform(0.0, 2 * SLICE_MS)
        await asyncio.sleep(max(0.0, at_ms / 1000 - time.time()))
        sent_ms = time.time() * 1000
        await client.send_json({"type": "cancel", "utterance": utterance})
        await client.wait_for(lambda g: any(e["utterance"] == utterance for e in g.ends()), 30)
        end = next(e for e in client.got.ends() if e["utterance"] == utterance)
        frames = client.got.frames_of(utterance)
        last = frames[-1]
        stop_ms = last.pts_us / 1000 + SLICE_MS
        tail = np.frombuffer(last.payload, dtype="<i2")[-48:]  # the last 2 ms of the faded slice
        whole = (end["status"] == "cancelled" and end["chunks"] == len(frames)
                 and [f.chunk for f in frames] == list(range(len(frames))) and last.last
                 and int(np.abs(tail.astype(np.int32)).max(initial=0)) < 200)
        return Cut(stop_ms - sent_ms, first_pts_ms + length_ms - stop_ms, whole)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rooms", default="1,10,100", help="comma-separated room counts (default 1,10,100)")
    parser.add_argument("--after-ms", type=float, default=1500.0, help="cancel after the line played this long")
    args = parser.parse_args()
    counts = [int(n) for n in args.rooms.split(",")]
    logs = Path(tempfile.mkdtemp(prefix="bench-cancel-"))
    with RedisServer() as redis:
        worker = start_worker(redis.url, logs, contexts=2, VOXROOM_CACHE_SLOTS="0")
        gateway, port = start_gateway(redis.url, logs)
        try:
            length_ms = await uncut_length_ms(port)
            print(f"uncut line: {length_ms:.0f} ms of audio; cancel after {args.after_ms:.0f} ms of it; logs {logs}")
            print()
            print("| rooms speaking | cancels | silent after cancel p50 / p95 / p99 / max (ms) | "
                  "cut short by p50 (ms) | whole |")
            print("|---|---|---|---|---|")
            for n in counts:
                cuts = await asyncio.gather(*(one_room(port, f"bench-cancel-{n}-{i}", args.after_ms, length_ms)
                                              for i in range(n)))
                silent = [c.silent_after_ms for c in cuts]
                print(f"| {n} | {len(cuts)} | {_pct(silent, 0.5):.0f} / {_pct(silent, 0.95):.0f} / "
                      f"{_pct(silent, 0.99):.0f} / {max(silent):.0f} | "
                      f"{statistics.median(c.cut_short_ms for c in cuts):.0f} | "
                      f"{sum(c.whole for c in cuts)}/{len(cuts)} |", flush=True)
        finally:
            gateway.stop()
            worker.stop()


if __name__ == "__main__":
    asyncio.run(main())
