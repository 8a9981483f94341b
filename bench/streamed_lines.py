"""Lines streamed in as a language model writes them (issue 31), at 1, 10 and 100 rooms at once.

    .venv/bin/python bench/streamed_lines.py [--engine piper|synthetic] [--rooms 1,10,100]
                                              [--words-per-s 4]

Real processes: a private redis-server, one worker (``--engine piper``: the offline voices, the
line in Piper's ``en-joe``, two contexts; ``synthetic``: the benchmark engine, 50 ms to its first
chunk, 0.05 real time, continuous batches of up to 128 rows on one context), one gateway, the
audio cache off. Every room has one client that opens a line and sends a 45-word narration (the
issue asks for about 40) one word at a time at ``--words-per-s`` (the issue's "30 tokens a second,
about 4 words a second"), then closes it. A second client per room says the same text as one
whole line at the moment the model would have finished (its last word's time): the
baseline, in its own room, in the same run. Measured per room:

- **first audio after the first clause**: when the first slice of the line reached the client,
  minus when the word that completes the first clause (its comma) was sent. What the server adds
  to a clause once it is whole: cutting, synthesis of the clause, publishing (the issue's goal for
  Piper on this machine: p50 <= 150 ms).
- **silence inside the line**: the line's slices on the room clock, each 40 ms after the one
  before, unless the server had to wait for words (the rest moved later: a pause, never lost or
  doubled audio). The sum of those moves, and how many. Text faster than speech: 0.
- **streamed / whole end**: when the line's audio ends on the room clock, counted from when its
  first word was sent; the same for the whole line said once the model had finished (sent at the
  time of the last word). The streamed line ends sooner by the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store.server import RedisServer
from voxroom.wire.protocol import SLICE_MS

LINE = ("The night is long, and the village sleeps. Somewhere beyond the old mill, the wolves are "
        "gathering in the dark, while the seer turns in her bed and dreams of a face she cannot "
        "recall. At dawn, the bells will ring, and everyone will wake.")
WORDS = [w if i == 0 else " " + w for i, w in enumerate(LINE.split())]
FIRST_CLAUSE_WORD = next(i for i, w in enumerate(WORDS) if w.endswith((",", ".")))


@dataclass
class Room:
    first_audio_ms: float
    """From sending the word that completes the first clause to the line's first slice arriving."""
    moved_ms: float
    """Silence the server put inside the line (sum of its slices' moves later on the room clock)."""
    moves: int
    streamed_end_ms: float
    whole_end_ms: float
    whole: bool


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def one_room(port: int, room: str, voice: str, words_per_s: float) -> Room:
    async with RoomClient(port, room) as streamer, RoomClient(port, room + "-whole") as baseline:
        gap_s = 1.0 / words_per_s
        t0 = time.time() * 1000
        await streamer.send_json({"type": "say", "seq": 1, "text": WORDS[0], "voice": voice, "open": True})
        clause_sent_ms = t0
        for part, word in enumerate(WORDS[1:], start=1):
            await asyncio.sleep(gap_s)
            last = part == len(WORDS) - 1
            if part == FIRST_CLAUSE_WORD:
                clause_sent_ms = time.time() * 1000
            msg = {"type": "append", "seq": 1, "part": part, "text": word}
            if last:
                msg["final"] = True
            await streamer.send_json(msg)
        finished_ms = time.time() * 1000
        await baseline.say(LINE, voice)  # what a client does today: the whole line, once written
        await streamer.wait_for(lambda g: bool(g.ends()), 120)
        await baseline.wait_for(lambda g: bool(g.ends()), 120)
        frames = streamer.got.frames_of(1)
        first_arrival = streamer.got.frame_times[streamer.got.frames.index(frames[0])]
        moved = [b.pts_us / 1000 - a.pts_us / 1000 - SLICE_MS for a, b in itertools.pairwise(frames)]
        moved = [m for m in moved if m > 1.0]
        end = streamer.got.ends()[0]
        whole_frames = baseline.got.frames_of(1)
        return Room(first_arrival - clause_sent_ms, sum(moved), len(moved),
                    frames[-1].pts_us / 1000 + SLICE_MS - t0,
                    whole_frames[-1].pts_us / 1000 + SLICE_MS - t0,
                    end["status"] == "ok" and [f.chunk for f in frames] == list(range(end["chunks"]))
                    and finished_ms > t0)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["piper", "synthetic"], default="piper")
    parser.add_argument("--rooms", default="1,10,100", help="comma-separated room counts (default 1,10,100)")
    parser.add_argument("--words-per-s", type=float, default=4.0)
    args = parser.parse_args()
    counts = [int(n) for n in args.rooms.split(",")]
    logs = Path(tempfile.mkdtemp(prefix="bench-streamed-"))
    with RedisServer() as redis:
        if args.engine == "piper":
            worker = start_worker(redis.url, logs, contexts=2, VOXROOM_CACHE_SLOTS="0")
        else:
            # A batch engine, as ChatTTS on a GPU: rows join a running batch (continuous), so that
            # 100 rooms' clauses are made at once, as a deployment would.
            worker = start_worker(redis.url, logs, engine="synthetic", contexts=1, VOXROOM_CACHE_SLOTS="0",
                                  VOXROOM_SYNTHETIC_MAX_BATCH="128", VOXROOM_SYNTHETIC_CONTINUOUS="1",
                                  VOXROOM_CONTEXT_INFLIGHT="256", VOXROOM_CONTEXT_QUEUE="128")
        gateway, port = start_gateway(redis.url, logs)
        try:
            print(f"{args.engine}: {len(WORDS)} words at {args.words_per_s:g} words/s "
                  f"({len(WORDS) / args.words_per_s:.1f} s to write); first clause ends at word "
                  f"{FIRST_CLAUSE_WORD + 1}; logs {logs}")
            print()
            print("| rooms | first audio after the first clause p50 / p95 / p99 (ms) | silence inside "
                  "the line: rooms with any, total p50 / max (ms) | line ends after its first word: streamed / "
                  "whole line said when written, p50 (s) | whole |")
            print("|---|---|---|---|---|")
            for n in counts:
                rooms = await asyncio.gather(*(one_room(port, f"bench-stream-{n}-{i}", "en-joe", args.words_per_s)
                                               for i in range(n)))
                first = [r.first_audio_ms for r in rooms]
                moved = [r.moved_ms for r in rooms]
                print(f"| {n} | {_pct(first, 0.5):.0f} / {_pct(first, 0.95):.0f} / {_pct(first, 0.99):.0f} | "
                      f"{sum(r.moves > 0 for r in rooms)}/{n}, {statistics.median(moved):.0f} / {max(moved):.0f} | "
                      f"{statistics.median(r.streamed_end_ms for r in rooms) / 1000:.2f} / "
                      f"{statistics.median(r.whole_end_ms for r in rooms) / 1000:.2f} | "
                      f"{sum(r.whole for r in rooms)}/{n} |", flush=True)
        finally:
            gateway.stop()
            worker.stop()


if __name__ == "__main__":
    asyncio.run(main())
