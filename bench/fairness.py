"""Fairness across rooms under a skewed load (issue 14): first come first served against rooms in
turn with playout deadlines (``VOXROOM_CONTEXT_FAIR``), in the same run.

    .venv/bin/python bench/fairness.py [--rounds 3] [--rooms 20] [--flood 16] [--rtf 0.2]

One ``voxroom worker`` process (one context, the synthetic engine, audio cache off) against its
own redis-server. Per round and mode: one room floods its backlog (``--flood`` lines of about 5 s,
``VOXROOM_MAX_PENDING_PER_ROOM``'s default 16), then ``--rooms`` rooms send one short line each,
written to ``vx:jobs`` as the gateway's ingress script writes them. A third mode is the yardstick:
the same rooms with no flood at all (what one context's queueing costs them anyway; the flood
should add at most one of its lines). Time to first audio of a single-line room: the gateway's
accept stamp (the job's ``time``) to its ``start`` entry in the room's output stream (the entry
travels with the first slice; its id is Redis's clock, the same host's). The gateway's own hop
is left out: it is the same in every mode. What the fair order costs the flooding room: the
silence between its first line and its second (on one saturated context, the rooms that have had
no line go first).

The synthetic engine sleeps instead of computing; ``--rtf`` sets how long a line takes to make
(0.2: a 5.4 s line of the flood takes about 1.1 s, one line's synthesis; a single line 0.3 s). The
modes alternate per round, so that a busy machine weighs on both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from redis.asyncio import Redis  # noqa: E402

from tests.support.outputs import add_jobs  # noqa: E402
from tests.support.processes import start_worker  # noqa: E402
from voxroom.store import clients as redis_client  # noqa: E402
from voxroom.store import keys  # noqa: E402
from voxroom.store.server import RedisServer  # noqa: E402
from voxroom.wire.protocol import SLICE_MS  # noqa: E402

FLOOD = "The werewolves wake up and choose, in silence, who will not see the morning."  # about 6 s
SINGLE = "Hi there, everyone."  # about 1.4 s
CHARS_PER_SECOND = 14.0  # the synthetic engine's speaking rate (workers/engines/synthetic.py)


async def one_run(url: str, logs: Path, *, fair: bool, tag: str, rooms: int, flood: int, rtf: float,
                  ttfc_ms: float) -> tuple[list[float], float | None, float | None]:
    """(each single-line room's time to first audio in ms, the flood's first line's, the flood's
    silence between its first and second lines; both ``None`` without a flood)."""
    env = {"VOXROOM_CACHE_SLOTS": "0", "VOXROOM_OPUS_BITRATE": "0", "VOXROOM_SYNTHETIC_TTFC_MS": str(ttfc_ms),
           "VOXROOM_SYNTHETIC_RTF": str(rtf), "VOXROOM_CONTEXT_FAIR": "1" if fair else "0"}
    worker = start_worker(url, logs, engine="synthetic", contexts=1, name=f"worker-{tag}", **env)
    r: Redis = redis_client.from_url(url, decode_responses=True)
    try:
        flood_room = f"{tag}-flood"
        singles = [f"{tag}-single-{i}" for i in range(rooms)]
        if flood:
            await add_jobs(r, [(flood_room, FLOOD)] * flood)
        await add_jobs(r, [(room, SINGLE) for room in singles])
        accepted: dict[str, float] = {}
        for _entry_id, fields in await r.xrange(keys.JOBS):
            accepted.setdefault(fields["room"], float(fields["time"]))
        firsts: dict[str, float] = {}
        deadline = time.monotonic() + 120 + flood * 10
        watched = [flood_room, *singles] if flood else singles
        while len(firsts) < len(watched):
            for room in watched:
                if room in firsts:
                    continue
                for entry_id, fields in await r.xrange(keys.room_output(room), count=1):
                    if fields.get("kind") == "start":
                        firsts[room] = float(entry_id.split("-")[0])
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(firsts)} of {len(watched)} rooms started")
            await asyncio.sleep(0.05)
        waits = [firsts[room] - accepted[room] for room in singles]
        if not flood:
            return waits, None, None
        return waits, firsts[flood_room] - accepted[flood_room], await flood_silence(url, flood_room, deadline)
    finally:
        worker.kill()
        await r.flushall()
        await r.aclose()


async def flood_silence(url: str, room: str, deadline: float) -> float:
    """What the fair order costs the flooding room: the silence between its first line's audio
    and its second's, in ms (0 when the second came in time). Each line's ``start`` entry goes out
    with its first slice, the same lead before it plays, so the gap is the distance between the
    two starts less the first line's length (the synthetic engine's: its text at
    ``CHARS_PER_SECOND``, in whole slices)."""
    starts: dict[int, float] = {}
    after = b"-"
    raw: Redis = redis_client.from_url(url)  # the chunk entries hold audio: bytes, not text
    try:
        while 2 not in starts:
            for entry_id, fields in await raw.xrange(keys.room_output(room), min=after, count=64):
                after = b"(" + entry_id
                if fields.get(b"kind") == b"start":
                    starts[int(fields[b"seq"])] = float(entry_id.split(b"-")[0])
            if time.monotonic() > deadline:
                raise TimeoutError(f"room {room}: no second line")
            await asyncio.sleep(0.05)
    finally:
        await raw.aclose()
    # The line plays in whole slices: its last one is padded with silence.
    played_ms = math.ceil(1000 * len(FLOOD) / CHARS_PER_SECOND / SLICE_MS) * SLICE_MS
    return max(0.0, starts[2] - starts[1] - played_ms)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rooms", type=int, default=20)
    parser.add_argument("--flood", type=int, default=16)
    parser.add_argument("--rtf", type=float, default=0.2)
    parser.add_argument("--ttfc-ms", type=float, default=50.0)
    args = parser.parse_args()
    line_ms = args.ttfc_ms + args.rtf * 1000 * len(FLOOD) / CHARS_PER_SECOND
    modes = ("fifo", "fair", "alone")
    results: dict[str, list[float]] = {mode: [] for mode in modes}
    flood_first: dict[str, list[float]] = {mode: [] for mode in modes}
    flood_gap: dict[str, list[float]] = {mode: [] for mode in modes}
    with RedisServer() as server, tempfile.TemporaryDirectory() as tmp:
        for n in range(args.rounds):
            for mode in (modes if n % 2 == 0 else modes[::-1]):
                waits, first, gap = await one_run(server.url, Path(tmp), fair=mode != "fifo", tag=f"{mode}{n}",
                                             rooms=args.rooms, flood=args.flood if mode != "alone" else 0,
                                             rtf=args.rtf, ttfc_ms=args.ttfc_ms)
                results[mode] += waits
                if first is not None and gap is not None:
                    flood_first[mode].append(first)
                    flood_gap[mode].append(gap)
                print(f"round {n} {mode}: single-line rooms p50 {statistics.median(waits):.0f} ms, "
                      f"max {max(waits):.0f} ms", file=sys.stderr)
    print(f"\nOne flooding room ({args.flood} lines of {len(FLOOD) / CHARS_PER_SECOND:.1f} s), then {args.rooms} "
          f"rooms with one line each; one context, synthetic engine rtf {args.rtf}, first chunk "
          f"{args.ttfc_ms:.0f} ms: one flood line's synthesis is about {line_ms:.0f} ms. {args.rounds} rounds.\n")
    print("| scheduling | single-line rooms: first audio p50 | p95 | max | flood's first line | flood's silence "
          "before its second line |")
    print("|---|---|---|---|---|---|")
    for mode, label in (("fifo", "first come first served (`VOXROOM_CONTEXT_FAIR=0`)"),
                        ("fair", "rooms in turn, the fewest lines first, playout deadline first (default)"),
                        ("alone", "no flood at all (the single-line rooms alone, default)")):
        v, f, g = results[mode], flood_first[mode], flood_gap[mode]
        print(f"| {label} | {statistics.median(v):.0f} ms | {pct(v, 0.95):.0f} ms | {max(v):.0f} ms | "
              f"{f'{statistics.median(f):.0f} ms' if f else '-'} | "
              f"{f'{statistics.median(g):.0f} ms (max {max(g):.0f})' if g else '-'} |")


if __name__ == "__main__":
    asyncio.run(main())
