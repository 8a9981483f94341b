"""Where a room's output stream memory goes, by ``stream-node-max-bytes``: a table.

For each node size, a private redis-server gets ``--rooms`` output streams of ``--seconds`` of audio
each, written as workers write them: 40 ms slices, the first of a line alone and the rest two to an
entry (voxroom/wire/output_entries.py ``group_fields``, real AudioFrame bytes, random PCM), with or without
an Opus copy of each slice (``--opus-bytes``). It prints ``MEMORY USAGE`` of a stream against the PCM
it holds, the ``used_memory`` growth, the stream's nodes (``XINFO STREAM FULL``), and Redis's CPU per
``XADD`` and per entry read back by ``XREAD`` from a cursor (what a gateway's reader does), from
``INFO cpu`` deltas.

    .venv/bin/python bench/stream_nodes.py                     # 4, 16, 32, 64 KiB nodes, PCM and Opus
    .venv/bin/python bench/stream_nodes.py --sizes 4096,65536 --rooms 50
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

import redis  # noqa: E402

from voxroom.wire.output_entries import group_fields  # noqa: E402
from voxroom.wire.protocol import ROOM_RATE, AudioFrame  # noqa: E402
from voxroom.store.server import find_redis_server, free_port  # noqa: E402

SLICE_SAMPLES = ROOM_RATE * 40 // 1000
PCM_PER_SLICE = SLICE_SAMPLES * 2


def cpu_s(r: redis.Redis) -> float:
    info: Any = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def entries_of(room: str, slices: int, opus_bytes: int) -> list[dict[str, Any]]:
    """One line's entries as a paced worker writes them: slice 0 alone, then pairs."""
    frames = [AudioFrame(room=room, seq=1, chunk=i, pts_us=i * 40_000, sample_rate=ROOM_RATE, samples=SLICE_SAMPLES,
                         payload=os.urandom(PCM_PER_SLICE)).encode() for i in range(slices)]
    opus = [os.urandom(opus_bytes) for _ in range(slices)] if opus_bytes else None
    out = [group_fields(1, 0, frames[:1], opus[:1] if opus else None)]
    for i in range(1, slices, 2):
        out.append(group_fields(1, i, frames[i:i + 2], opus[i:i + 2] if opus else None))
    return out


def one(size: int, args: argparse.Namespace, opus_bytes: int) -> dict[str, float]:
    port = free_port()
    proc = subprocess.Popen([find_redis_server(), "--port", str(port), "--save", "", "--appendonly", "no",
                             "--stream-node-max-bytes", str(size)], stdout=subprocess.DEVNULL)
    try:
        r = redis.Redis(port=port)
        for _ in range(100):
            try:
                r.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        slices = int(args.seconds / 0.040)
        rooms = [f"bench-{i:04d}" for i in range(args.rooms)]
        batches = {room: entries_of(room, slices, opus_bytes) for room in rooms}
        base, c0 = int(r.info("memory")["used_memory"]), cpu_s(r)
        adds = 0
        # Interleaved as live rooms write: one entry of every room in turn.
        for i in range(max(len(b) for b in batches.values())):
            pipe = r.pipeline(transaction=False)
            for room in rooms:
                if i < len(batches[room]):
                    pipe.xadd(f"vx:room:{{{room}}}:out", batches[room][i])
                    adds += 1
            pipe.execute()
        add_cpu = cpu_s(r) - c0
        grown = int(r.info("memory")["used_memory"]) - base
        usage = sum(int(r.memory_usage(f"vx:room:{{{room}}}:out", samples=0) or 0) for room in rooms)
        info: Any = r.xinfo_stream(f"vx:room:{{{rooms[0]}}}:out")
        nodes = int(info["radix-tree-nodes"])
        # A reader following each stream from the start, 10 entries a call (a gateway's reader).
        c1, read = cpu_s(r), 0
        for room in rooms:
            cursor = "0-0"
            while True:
                got: Any = r.xread({f"vx:room:{{{room}}}:out": cursor}, count=10)
                if not got:
                    break
                entries = got[0][1]
                read += len(entries)
                cursor = entries[-1][0]
        read_cpu = cpu_s(r) - c1
        pcm = args.rooms * slices * PCM_PER_SLICE
        r.close()
        return {"usage_x": usage / pcm, "grown_x": grown / pcm, "nodes": nodes, "entries": len(batches[rooms[0]]),
                "add_us": add_cpu / adds * 1e6, "read_us": read_cpu / read * 1e6}
    finally:
        proc.terminate()
        proc.wait(10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4096,16384,32768,65536", help="stream-node-max-bytes values")
    parser.add_argument("--rooms", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=120.0, help="audio per stream (the resume window)")
    parser.add_argument("--opus-bytes", type=int, default=160, help="an Opus copy per slice (0: PCM only)")
    args = parser.parse_args()
    print(f"\n{args.rooms} streams x {args.seconds:.0f} s of audio; redis-server {find_redis_server()}\n")
    print("| stream-node-max-bytes | copies | MEMORY USAGE / PCM | used_memory / PCM | radix nodes (entries) a stream "
          "| Redis CPU per XADD | per entry read (XREAD COUNT 10) |")
    print("|---|---|---|---|---|---|---|")
    for opus in (0, args.opus_bytes) if args.opus_bytes else (0,):
        for size in (int(s) for s in args.sizes.split(",")):
            m = one(size, args, opus)
            print(f"| {size} | {'PCM + Opus ' + str(opus) + ' B' if opus else 'PCM'} | {m['usage_x']:.3f}x | "
                  f"{m['grown_x']:.3f}x | {m['nodes']:.0f} ({m['entries']:.0f}) | {m['add_us']:.1f} µs | "
                  f"{m['read_us']:.1f} µs |", flush=True)
    print(f"\ncommand: .venv/bin/python bench/stream_nodes.py --sizes {args.sizes} --rooms {args.rooms} "
          f"--seconds {args.seconds:g} --opus-bytes {args.opus_bytes}")


if __name__ == "__main__":
    main()
