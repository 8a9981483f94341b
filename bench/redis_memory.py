"""Redis bytes per room: what a speaking room and an idle room cost, for sizing ``maxmemory``.

Starts a private redis-server, one ``voxroom worker`` (synthetic engine: audio as long as real
speech, no model) and one ``voxroom gateway``, warms them up with one room whose keys are then
deleted (so the baseline holds what the server keeps per process, not per room), then has
```--rooms`` rooms speak ``--lines`` lines each, one after another, with a listener in each.

It reports, from ``MEMORY USAGE key SAMPLES 0`` averaged over the rooms, what each room key holds,
the output stream's bytes per second of audio (the term that dominates), ``used_memory`` deltas
per room while the rooms speak (peak) and once they are idle (every line played, keys still
there), and, with ``--ttl``, ``used_memory`` once the idle TTL has passed (back to the baseline).

    .venv/bin/python bench/redis_memory.py --rooms 20 --lines 3
    .venv/bin/python bench/redis_memory.py --rooms 20 --lines 3 --codec opus   # Opus copies too
    .venv/bin/python bench/redis_memory.py --rooms 10 --lines 2 --ttl 12       # and the expiry
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from redis.asyncio import Redis  # noqa: E402

from tests.support.processes import start_gateway, start_worker  # noqa: E402
from tests.support.room_client import RoomClient  # noqa: E402
from voxroom.runtime.settings import Settings  # noqa: E402
from voxroom.store import keys  # noqa: E402
from voxroom.store.server import RedisServer  # noqa: E402

ROOM_KEYS = ("seq", "state", "senders", "utt", "out")
CHARS_PER_SECOND = 14.0  # the synthetic engine's speaking rate (workers/engines/synthetic.py)
SLICE_S = 0.040  # one slice of audio (voxroom/wire/protocol.py); a chunk entry holds one or several
PCM_BYTES_PER_S = 24_000 * 2  # the room rate, 16-bit mono


def line_of(chars: int, i: int) -> str:
    words = "the quick brown fox jumps over the lazy dog while the band plays on ".split()
    out: list[str] = []
    while len(" ".join(out)) < chars:
        out.append(words[(i + len(out)) % len(words)])
    return " ".join(out)[:chars]


async def used_memory(r: Redis) -> int:
    return int((await r.info("memory"))["used_memory"])


async def speak(port: int, r: Redis, room: str, lines: int, chars: int, codec: str) -> tuple[float, dict[str, int]]:
    """Speak ``lines`` lines one after another, listening. The seconds of audio the room got, and
    what each of its keys holds right after its last line ended (before any TTL can pass)."""
    client = RoomClient(port, room)
    if codec != "pcm16":
        client.url += f"?codec={codec}"
    async with client:
        for n in range(1, lines + 1):
            await client.say(line_of(chars, n))
            await client.wait_ends(n, timeout=120)
        ends = client.got.ends()
        if [e.get("status") for e in ends] != ["ok"] * lines:
            raise RuntimeError(f"{room}: {ends}")
    sizes = {name: int(await r.memory_usage(keys.room_key(room, name), samples=0) or 0)
             for name in ROOM_KEYS}
    return sum(float(e.get("duration_ms") or 0) for e in ends) / 1000.0, sizes


async def silent(port: int, rooms: list[str], codec: str, joined: asyncio.Event, leave: asyncio.Event) -> None:
    """A listener in each of ``rooms``, nobody speaking, until ``leave``."""
    clients = [RoomClient(port, room) for room in rooms]
    for client in clients:
        if codec != "pcm16":
            client.url += f"?codec={codec}"
        await client.__aenter__()
    joined.set()
    try:
        await leave.wait()
    finally:
        for client in clients:
            await client.__aexit__(None, None, None)


async def stream_audio(raw: Redis, room: str) -> tuple[int, int, int]:
    """What a room's output stream holds (``raw``: a client without decoding, the frames are
    binary): slices, counted in its chunk entries, which hold one or several (``slices``;
    voxroom/wire/output_entries.py), the bytes of their frames, and of their Opus copies."""
    entries: Any = await raw.xrange(keys.room_output(room))
    slices = frame_bytes = opus_bytes = 0
    for _, fields in entries:
        if fields.get(b"kind") != b"chunk":
            continue
        slices += int(fields.get(b"slices", 1))
        frame_bytes += sum(len(v) for k, v in fields.items() if k.startswith(b"frame"))
        opus_bytes += sum(len(v) for k, v in fields.items() if k.startswith(b"opus"))
    return slices, frame_bytes, opus_bytes


async def sample_peak(r: Redis, stop: asyncio.Event, peak: list[int]) -> None:
    while not stop.is_set():
        peak[0] = max(peak[0], await used_memory(r))
        await asyncio.sleep(0.25)


async def measure(url: str, port: int, args: argparse.Namespace) -> dict[str, Any]:
    r = Redis.from_url(url, decode_responses=True)
    try:
        await speak(port, r, "mem-warmup", 1, args.chars, args.codec)
        await r.delete(*[keys.room_key("mem-warmup", name) for name in ROOM_KEYS], keys.ROOMS)
        base = await used_memory(r)

        # Rooms with a listener and no line: what joining alone costs (an Opus listener keeps
        # ``:opus``, a flag with a 30 s TTL, alive).
        joined, leave = asyncio.Event(), asyncio.Event()
        listeners = asyncio.create_task(
            silent(port, [f"mem-silent-{i}" for i in range(args.rooms)], args.codec, joined, leave),
            name="bench:silent-rooms")
        await joined.wait()
        await asyncio.sleep(1.0)  # the gateway's joins are pipelined: let them land
        silent_bytes = await used_memory(r) - base
        leave.set()
        await listeners
        base = await used_memory(r)

        rooms = [f"mem-{i}" for i in range(args.rooms)]
        stop, peak = asyncio.Event(), [base]
        sampler = asyncio.create_task(sample_peak(r, stop, peak), name="bench:memory-sampler")
        t0 = time.monotonic()
        try:
            spoken = await asyncio.gather(*(speak(port, r, room, args.lines, args.chars, args.codec)
                                            for room in rooms))
        finally:
            stop.set()
            await sampler
        spoke_s = time.monotonic() - t0
        idle = await used_memory(r)
        per_key = {name: [sizes[name] for _, sizes in spoken] for name in ROOM_KEYS}
        jobs = int(await r.xlen(keys.JOBS))
        jobs_bytes = int(await r.memory_usage(keys.JOBS, samples=0) or 0)
        out_entries = statistics.mean([int(await r.xlen(keys.room_output(room))) for room in rooms])
        # Audio still in the output stream (a room that spoke longer than the resume window has had
        # its oldest audio trimmed away), by its slices: counting entries took a pair for one.
        raw = Redis.from_url(url)
        try:
            held = [await stream_audio(raw, room) for room in rooms]
        finally:
            await raw.aclose()
        in_stream_s = statistics.mean(h[0] for h in held) * SLICE_S
        frame_bytes = statistics.mean(h[1] for h in held)
        opus_bytes = statistics.mean(h[2] for h in held)
        expired: int | None = None
        if args.ttl:
            deadline = time.monotonic() + args.ttl + 60
            while any([await r.exists(*[keys.room_key(room, name) for name in ROOM_KEYS])
                       for room in rooms]):
                if time.monotonic() > deadline:
                    raise RuntimeError("rooms did not expire")
                await asyncio.sleep(0.5)
            expired = await used_memory(r)
        return {"base": base, "peak": peak[0], "idle": idle, "expired": expired, "per_key": per_key,
                "audio_s": statistics.mean(a for a, _ in spoken), "spoke_s": spoke_s, "jobs": jobs,
                "jobs_bytes": jobs_bytes, "out_entries": out_entries, "in_stream_s": in_stream_s,
                "frame_bytes": frame_bytes, "opus_bytes": opus_bytes,
                "silent": silent_bytes}
    finally:
        await r.aclose()


def report(m: dict[str, Any], args: argparse.Namespace) -> None:
    n = args.rooms
    window_s = Settings().resume_window_ms / 1000.0
    mean = {name: statistics.mean(v) for name, v in m["per_key"].items()}
    fixed = sum(v for name, v in mean.items() if name != "out")
    out_per_s = mean["out"] / max(SLICE_S, m["in_stream_s"])
    kib = 1024.0
    print(f"\nRedis memory per room ({n} rooms x {args.lines} lines of {args.chars} characters, codec {args.codec}, "
          f"{m['audio_s']:.1f} s of audio per room, {m['out_entries']:.0f} output entries per room, "
          f"spoken in {m['spoke_s']:.1f} s)\n")
    print("| key | bytes per room (mean) | note |")
    print("|---|---|---|")
    notes = {"seq": "a counter", "state": "next, end_ms, started, voice",
             "senders": "one field per client that spoke", "utt": f"{args.lines} lines of text",
             "out": f"{m['in_stream_s']:.1f} s of audio in it: {out_per_s / kib:.1f} KiB per second of audio"}
    for name in ROOM_KEYS:
        print(f"| `:{name}` | {mean[name]:,.0f} | {notes[name]} |")
    print(f"| all but `:out` | {fixed:,.0f} | a room's fixed cost |")
    pcm = m["in_stream_s"] * PCM_BYTES_PER_S
    held = m["frame_bytes"] + m["opus_bytes"]
    print(f"| `:out` against what it holds | {mean['out'] / max(1.0, pcm):.3f}x the PCM | "
          f"{pcm / kib:,.0f} KiB of PCM; {mean['out'] / max(1.0, held):.3f}x its frames and Opus copies "
          f"({m['frame_bytes'] / kib:,.0f} + {m['opus_bytes'] / kib:,.0f} KiB) |")
    print(f"| `vx:jobs` entry | {m['jobs_bytes'] / max(1, m['jobs']):,.0f} | per accepted line (mean over "
          f"{m['jobs']}), until `VOXROOM_JOBS_MAXLEN` trims it: not a room's |")
    print()
    print("| used_memory | total over baseline | per room |")
    print("|---|---|---|")
    print(f"| silent (a listener, no line) | {m['silent'] / kib:,.0f} KiB | {m['silent'] / n / kib:,.1f} KiB |")
    print(f"| speaking (peak while the lines played) | {(m['peak'] - m['base']) / kib:,.0f} KiB | "
          f"{(m['peak'] - m['base']) / n / kib:,.1f} KiB |")
    print(f"| idle (every line played, within the TTL) | {(m['idle'] - m['base']) / kib:,.0f} KiB | "
          f"{(m['idle'] - m['base']) / n / kib:,.1f} KiB |")
    if m["expired"] is not None:
        print(f"| after the idle TTL ({args.ttl} s) | {(m['expired'] - m['base']) / kib:,.0f} KiB | "
              f"{(m['expired'] - m['base']) / n / kib:,.1f} KiB |")
    full = fixed + out_per_s * window_s
    print(f"\nprojection: a room that spoke through the whole resume window ({window_s:.0f} s) holds "
          f"{full / 2**20:.2f} MiB until it expires; 1,000 such rooms {full * 1000 / 2**30:.2f} GiB")
    print(f"\ncommand: .venv/bin/python bench/redis_memory.py --rooms {n} --lines {args.lines} --chars {args.chars} "
          f"--codec {args.codec}" + (f" --ttl {args.ttl}" if args.ttl else ""))


async def run(args: argparse.Namespace) -> None:
    if args.ttl and args.ttl < args.chars / CHARS_PER_SECOND + 5:
        raise SystemExit(f"--ttl must outlast a line ({args.chars / CHARS_PER_SECOND:.0f} s) by 5 s: the keys "
                         "are measured after the last line ends")
    ttl = str(args.ttl or 3600)
    with tempfile.TemporaryDirectory(prefix="vx-bench-") as tmp, RedisServer() as redis:
        # No audio cache: it is not a room's (it has its own bound, cache_slots x entry size).
        worker = start_worker(redis.url, Path(tmp), engine="synthetic", contexts=2, VOXROOM_CACHE_SLOTS="0",
                              VOXROOM_CONTEXT_INFLIGHT=str(max(64, args.rooms)), VOXROOM_ROOM_IDLE_TTL_S=ttl)
        try:
            gateway, port = start_gateway(redis.url, Path(tmp), VOXROOM_LOG_LEVEL="WARNING",
                                          VOXROOM_ROOM_IDLE_TTL_S=ttl)
            try:
                report(await measure(redis.url, port, args), args)
            finally:
                gateway.stop()
        finally:
            worker.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rooms", type=int, default=20)
    parser.add_argument("--lines", type=int, default=3, help="lines each room speaks, one after another")
    parser.add_argument("--chars", type=int, default=70, help="characters a line (14 a second of audio)")
    parser.add_argument("--codec", default="pcm16", choices=["pcm16", "opus"],
                        help="what the listeners ask for: opus makes workers add an Opus copy of every slice")
    parser.add_argument("--ttl", type=int, default=0,
                        help="VOXROOM_ROOM_IDLE_TTL_S for the run; > 0 also waits for the rooms to expire")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
