"""Per-unit costs for a capacity model, and the model itself for 10k and 100k rooms.

    .venv/bin/python bench/capacity.py --rooms 20 --lines 3 --reps 3

Starts one single-instance stack (a private redis-server, one ``voxroom worker`` with the synthetic
engine, one ``voxroom gateway``: real processes on loopback, as bench/latency.py does), then, per
repetition and per codec (PCM, Opus), ``--rooms`` rooms of 12 lean clients (bench/_wsclient.py;
one of the 12 speaks) say ``--lines`` lines of about 3 s each, one after another per room, all
rooms at once. Costs are **CPU time** of each process (every thread's time on a CPU, in ns, from
/proc/PID/task/*/schedstat; a thread that exits mid-window would be missed: none does here), not
wall time, so a machine shared with other jobs changes them little:

- an idle window first (no client at all: each process's own upkeep), then a silent window with
  every client connected (hub and heartbeat upkeep per connected room; the gateway's 20 s pings
  fall outside a 5 s window opened right after the joins), then the lines;
- a line's cost = CPU during the lines, minus the silent-window rate over the same wall time.

The synthetic engine sleeps instead of computing (it stands for a GPU): what the worker spends is
the server's own (intake, slicer, publisher, Opus encoding, Redis I/O). Redis memory per room comes
from bench/redis_memory.py's own measurement, run on the same stack. Speaking rooms per GPU are
not measured here (no GPU): ``--gpu-rooms`` is an estimate documented in docs/deployment.md
("Capacity model"), to be replaced by ``bench/gpu_check.sh`` on a GPU.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _wsclient import Listener, connect, raise_nofile  # noqa: E402
from redis_memory import SLICE_S, line_of  # noqa: E402
from redis_memory import measure as measure_memory  # noqa: E402

from tests.support.processes import start_gateway, start_worker  # noqa: E402
from voxroom.runtime.settings import Settings  # noqa: E402
from voxroom.store.server import RedisServer  # noqa: E402

PER_ROOM = 12  # the werewolf shape: 12 players, each a listener; one of them speaks here
PROCS = ("redis", "gateway", "worker")


class Talker(Listener):
    """A lean client that also speaks: it notes each line's ``start`` pts and ``end`` duration."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.plays_until_ms = 0.0
        self.ends: list[float] = []
        self.errors: list[dict[str, Any]] = []
        self.changed = asyncio.Event()
        self._start_pts = 0.0

    def text_frame(self, data: bytes) -> None:
        msg = json.loads(data)
        kind = msg.get("type")
        if kind == "start":
            self._start_pts = float(msg["pts_ms"])
        elif kind == "end":
            self.ends.append(float(msg.get("duration_ms") or 0.0))
            self.plays_until_ms = max(self.plays_until_ms, self._start_pts + self.ends[-1])
            self.changed.set()
        elif kind == "error":
            self.errors.append(msg)
            self.changed.set()

    async def say(self, text: str, seq: int, timeout: float = 60.0) -> None:
        self.send_text(json.dumps({"type": "say", "seq": seq, "text": text, "voice": "en-espeak"}))
        async with asyncio.timeout(timeout):
            while len(self.ends) < seq:
                if self.errors:
                    raise RuntimeError(f"the server refused a line: {self.errors[-1]}")
                self.changed.clear()
                await self.changed.wait()


def cpu_s(pids: dict[str, int]) -> dict[str, float]:
    """Seconds on a CPU so far, every thread of each process. ``/proc/PID/task/*/schedstat`` counts
    nanoseconds; ``/proc/PID/stat`` (psutil) only whole 10 ms ticks, too coarse for an idle window."""
    out = {}
    for name, pid in pids.items():
        try:
            out[name] = sum(int((task / "schedstat").read_text().split()[0])
                            for task in Path(f"/proc/{pid}/task").iterdir()) / 1e9
        except (OSError, ValueError, IndexError):
            t = psutil.Process(pid).cpu_times()
            out[name] = t.user + t.system
    return out


async def window(pids: dict[str, int], seconds: float) -> dict[str, float]:
    """Each process's CPU rate (cores) over ``seconds`` of doing nothing new."""
    c0, t0 = cpu_s(pids), time.monotonic()
    await asyncio.sleep(seconds)
    c1, t1 = cpu_s(pids), time.monotonic()
    return {k: (c1[k] - c0[k]) / (t1 - t0) for k in pids}


async def one_phase(port: int, pids: dict[str, int], args: argparse.Namespace, codec: str, tag: str,
                    idle: dict[str, float]) -> dict[str, float]:
    query = "?codec=opus" if codec == "opus" else ""
    rooms = [f"cap-{tag}-{codec}-{i}" for i in range(args.rooms)]
    talkers: list[Talker] = []
    members: list[Listener] = []
    sem = asyncio.Semaphore(50)

    async def join(room: str) -> None:
        async with sem:
            talker = await connect("127.0.0.1", port, f"/rooms/{room}/ws{query}", kind=Talker)
            assert isinstance(talker, Talker)
            talkers.append(talker)
            members.append(talker)
            for j in range(PER_ROOM - 1):
                members.append(await connect("127.0.0.1", port, f"/rooms/{room}/ws{query}&client=l{j}"
                                             if query else f"/rooms/{room}/ws?client=l{j}"))

    try:
        await asyncio.gather(*(join(room) for room in rooms))
        await asyncio.sleep(1.0)
        silent = await window(pids, args.idle_s)
        for m in members:
            m.frames = 0
        c0, t0 = cpu_s(pids), time.monotonic()

        async def speak(i: int, talker: Talker) -> None:
            for n in range(1, args.lines + 1):
                # Never the same text twice: a repeat would be an audio-cache hit, not a line made.
                suffix = f" {tag}{codec[0]}{i}x{n}"
                await talker.say(line_of(args.chars - len(suffix), n) + suffix, n)

        await asyncio.gather(*(speak(i, t) for i, t in enumerate(talkers)))
        until = max(t.plays_until_ms for t in talkers)
        await asyncio.sleep(max(0.0, until - time.time() * 1000) / 1000 + 0.3)
        c1, t1 = cpu_s(pids), time.monotonic()
    finally:
        for m in members:
            m.close()
        await asyncio.sleep(0.5)
    wall = t1 - t0
    lines = len(rooms) * args.lines
    audio_s = sum(sum(t.ends) for t in talkers) / 1000.0
    listener_s = audio_s * PER_ROOM
    frames = sum(m.frames for m in members)
    net = {k: c1[k] - c0[k] - silent[k] * wall for k in pids}
    return {
        "redis_ms_per_line": net["redis"] * 1000 / lines,
        "worker_ms_per_line": net["worker"] * 1000 / lines,
        "gateway_us_per_listener_s": net["gateway"] * 1e6 / listener_s,
        "line_s": audio_s / lines,
        "delivered": frames * SLICE_S / listener_s,
        # Upkeep of a connected, silent room of 12 (per room, in cores), over the no-client window.
        "redis_idle_room": (silent["redis"] - idle["redis"]) / len(rooms),
        "gateway_idle_room": (silent["gateway"] - idle["gateway"]) / len(rooms),
    }


async def measure(args: argparse.Namespace, redis_url: str, port: int, pids: dict[str, int]) -> dict[str, Any]:
    reps: list[dict[str, dict[str, float]]] = []
    for rep in range(args.reps):
        idle = await window(pids, args.idle_s)
        row = {}
        for codec in args.codecs.split(","):
            row[codec] = await one_phase(port, pids, args, codec, f"r{rep}", idle)
            print(f"rep {rep + 1} {codec}: " + ", ".join(f"{k} {v:.4g}" for k, v in row[codec].items()), flush=True)
        reps.append(row)
    mem = {}
    for codec in args.codecs.split(","):
        mem_args = argparse.Namespace(rooms=args.mem_rooms, lines=2, chars=args.chars, codec=codec, ttl=0)
        mem[codec] = await measure_memory(redis_url, port, mem_args)
    return {"reps": reps, "mem": mem}


# -- the model ---------------------------------------------------------------------------------


def p50_spread(values: list[float]) -> tuple[float, float, float]:
    return statistics.median(values), min(values), max(values)


def unit_costs(m: dict[str, Any], args: argparse.Namespace) -> dict[str, tuple[float, float, float]]:
    """Every per-unit cost as (p50, min, max) over the repetitions; memory is one measurement."""
    reps = m["reps"]
    out: dict[str, tuple[float, float, float]] = {}
    for codec in args.codecs.split(","):
        for key in reps[0][codec]:
            out[f"{codec}:{key}"] = p50_spread([r[codec][key] for r in reps])
    n = args.mem_rooms
    for codec, mem in m["mem"].items():
        per_key = {name: statistics.mean(v) for name, v in mem["per_key"].items()}
        fixed = sum(v for name, v in per_key.items() if name != "out")
        out_per_s = per_key["out"] / max(SLICE_S, mem["in_stream_s"])
        for name, value in (("mem_fixed_B", fixed), ("mem_out_B_per_audio_s", out_per_s),
                            ("mem_speaking_B", (mem["peak"] - mem["base"]) / n),
                            ("mem_idle_B", (mem["idle"] - mem["base"]) / n)):
            out[f"{codec}:{name}"] = (value, value, value)
    return out


UNITS = [
    ("Redis CPU per line, PCM listeners", "pcm16:redis_ms_per_line", "ms", 1.0),
    ("Redis CPU per line, Opus listeners", "opus:redis_ms_per_line", "ms", 1.0),
    ("worker CPU per line (engine excluded), PCM", "pcm16:worker_ms_per_line", "ms", 1.0),
    ("worker CPU per line (engine excluded), Opus copy", "opus:worker_ms_per_line", "ms", 1.0),
    ("gateway CPU per listener-second, PCM", "pcm16:gateway_us_per_listener_s", "µs", 1.0),
    ("gateway CPU per listener-second, Opus", "opus:gateway_us_per_listener_s", "µs", 1.0),
    ("Redis CPU, a silent room of 12 connected", "pcm16:redis_idle_room", "µs/s", 1e6),
    ("gateway CPU, a silent room of 12 connected", "pcm16:gateway_idle_room", "µs/s", 1e6),
    ("line length (synthetic engine, 14 chars/s)", "pcm16:line_s", "s", 1.0),
    ("audio delivered / audio expected, PCM", "pcm16:delivered", "", 1.0),
    ("audio delivered / audio expected, Opus", "opus:delivered", "", 1.0),
    ("Redis memory, a room's fixed keys", "pcm16:mem_fixed_B", "B", 1.0),
    ("Redis memory, `:out` per second of audio in the window, PCM", "pcm16:mem_out_B_per_audio_s", "B", 1.0),
    ("Redis memory, `:out` per second of audio in the window, Opus", "opus:mem_out_B_per_audio_s", "B", 1.0),
    ("Redis used_memory per room while speaking (peak; 2 lines, PCM)", "pcm16:mem_speaking_B", "B", 1.0),
    ("Redis used_memory per room idle (played, within the TTL; PCM)", "pcm16:mem_idle_B", "B", 1.0),
    ("Redis used_memory per room idle (played, within the TTL; Opus)", "opus:mem_idle_B", "B", 1.0),
]


def fmt(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.3g}"


def print_units(u: dict[str, tuple[float, float, float]], args: argparse.Namespace) -> None:
    print(f"\nper-unit costs: {args.rooms} rooms x {PER_ROOM} clients, {args.lines} lines of {args.chars} "
          f"characters per room, {args.reps} repetitions (p50, min-max); CPU time from /proc\n")
    print("| unit | p50 | min | max | |")
    print("|---|---|---|---|---|")
    for label, key, unit, scale in UNITS:
        if key in u:
            print(f"| {label} | " + " | ".join(fmt(v * scale) for v in u[key]) + f" | {unit} |")


def model(u: dict[str, tuple[float, float, float]], args: argparse.Namespace, rooms: int,
          codec: str) -> list[tuple[str, str, str]]:
    """What ``rooms`` rooms need, with the arithmetic written out (rows: what, value, how)."""
    p = {k: v[0] for k, v in u.items()}
    duty = args.line_s / args.line_every_s
    lines_per_s = rooms / args.line_every_s
    speaking = rooms * duty
    speaking_peak = speaking + 3 * math.sqrt(speaking)  # Poisson-like: mean + 3 sigma
    listeners = rooms * PER_ROOM
    window_s = Settings().resume_window_ms / 1000.0
    audio_in_window = min(window_s, duty * window_s)
    room_bytes = p[f"{codec}:mem_fixed_B"] + p[f"{codec}:mem_out_B_per_audio_s"] * audio_in_window
    redis_cpu = lines_per_s * p[f"{codec}:redis_ms_per_line"] / 1000 + rooms * max(0.0, p[f"{codec}:redis_idle_room"])
    usable = args.redis_maxmemory_gib * 2**30 / 1.2 - args.redis_fixed_gib * 2**30
    by_cpu = math.ceil(redis_cpu / args.redis_target)
    by_mem = math.ceil(rooms * room_bytes / usable)
    listener_s = listeners * duty
    gw_cpu = (listener_s * p[f"{codec}:gateway_us_per_listener_s"] / 1e6
              + rooms * max(0.0, p[f"{codec}:gateway_idle_room"]))
    gw_cores = math.ceil(gw_cpu / args.core_target)
    gw_procs = max(gw_cores, math.ceil(listeners / args.max_connections))
    worker_cpu = lines_per_s * p[f"{codec}:worker_ms_per_line"] / 1000
    gpus = math.ceil(speaking_peak / args.gpu_rooms)
    wire = 4200 if codec == "opus" else 49100  # bytes/s per listener (docs/benchmarks.md, Opus)
    return [
        ("lines a second", f"{lines_per_s:,.0f}", f"{rooms:,} rooms / {args.line_every_s:g} s"),
        ("rooms speaking at once (mean / provisioned)", f"{speaking:,.0f} / {speaking_peak:,.0f}",
         f"rooms x {duty:.0%} duty; + 3 sqrt(mean)"),
        ("Redis CPU (cores)", f"{redis_cpu:.2f}",
         f"{lines_per_s:,.0f} lines/s x {p[f'{codec}:redis_ms_per_line']:.2f} ms + rooms x idle upkeep"),
        ("Redis memory (GiB)", f"{rooms * room_bytes / 2**30:.1f}",
         f"rooms x ({p[f'{codec}:mem_fixed_B'] / 1024:.1f} KiB + "
         f"{p[f'{codec}:mem_out_B_per_audio_s'] / 1024:.1f} KiB/s x "
         f"{audio_in_window:.0f} s of audio in the {window_s:.0f} s window)"),
        ("**Redis primaries**", f"**{max(by_cpu, by_mem)}**",
         f"max(CPU: {redis_cpu:.2f} / {args.redis_target:.0%} = {by_cpu}, memory: / "
         f"{usable / 2**30:.1f} GiB usable = {by_mem})"),
        ("listener-seconds a second", f"{listener_s:,.0f}", f"{listeners:,} listeners x {duty:.0%}"),
        ("gateway CPU (cores)", f"{gw_cpu:.1f}",
         f"x {p[f'{codec}:gateway_us_per_listener_s']:.0f} µs + rooms x idle upkeep"),
        ("**gateway cores** (one process each)", f"**{gw_procs}**",
         f"max(CPU / {args.core_target:.0%} = {gw_cores}, {listeners:,} sockets / "
         f"{args.max_connections:,} per process = {math.ceil(listeners / args.max_connections)})"),
        ("gateway egress (Gbit/s)", f"{listener_s * wire * 8 / 1e9:.1f}", f"x {wire:,} B/s per listener"),
        ("**worker cores** (besides the engine)", f"**{math.ceil(worker_cpu / args.core_target)}**",
         f"{lines_per_s:,.0f} lines/s x {p[f'{codec}:worker_ms_per_line']:.1f} ms = {worker_cpu:.2f} cores "
         f"/ {args.core_target:.0%}"),
        ("**GPUs** (estimate)", f"**{gpus}**", f"{speaking_peak:,.0f} / {args.gpu_rooms} speaking rooms per GPU "
         f"(at 16: {math.ceil(speaking_peak / 16)}, at 64: {math.ceil(speaking_peak / 64)})"),
    ]


def print_model(u: dict[str, tuple[float, float, float]], args: argparse.Namespace) -> None:
    codecs = [c for c in ("pcm16", "opus") if f"{c}:redis_ms_per_line" in u]
    p = {k: v[0] for k, v in u.items()}
    duty = args.line_s / args.line_every_s
    print(f"\ncapacity of one unit, a line of {args.line_s:g} s every {args.line_every_s:g} s per room "
          f"({duty:.0%} duty)\n")
    print("| unit | " + " | ".join(f"{c} listeners" for c in codecs) + " | arithmetic |")
    print("|---|" + "---|" * len(codecs) + "---|")
    per_primary = [args.redis_target / (p[f"{c}:redis_ms_per_line"] / 1000 / args.line_every_s
                                        + max(0.0, p[f"{c}:redis_idle_room"])) for c in codecs]
    print(f"| rooms per Redis primary (CPU, at {args.redis_target:.0%}) | "
          + " | ".join(f"{v:,.0f}" for v in per_primary)
          + f" | {args.redis_target:g} / (ms per line / {args.line_every_s:g} s + silent-room upkeep) |")
    usable = args.redis_maxmemory_gib * 2**30 / 1.2 - args.redis_fixed_gib * 2**30
    audio = min(1.0, duty) * Settings().resume_window_ms / 1000.0
    by_mem = [usable / (p[f"{c}:mem_fixed_B"] + p[f"{c}:mem_out_B_per_audio_s"] * audio) for c in codecs]
    print(f"| rooms per Redis primary (memory, {usable / 2**30:.1f} GiB for rooms) | "
          + " | ".join(f"{v:,.0f}" for v in by_mem) + f" | / (fixed keys + {audio:.0f} s x `:out` per s) |")
    for label, d in ((f"listeners per gateway core (at {args.core_target:.0%}, {duty:.0%} duty)", duty),
                     (f"listeners per gateway core (at {args.core_target:.0%}, every room speaking)", 1.0)):
        per_core = [args.core_target / (d * p[f"{c}:gateway_us_per_listener_s"] / 1e6
                                        + max(0.0, p[f"{c}:gateway_idle_room"]) / PER_ROOM) for c in codecs]
        print(f"| {label} | " + " | ".join(f"{v:,.0f}" for v in per_core)
              + f" | {args.core_target:g} / (duty x µs per listener-second + silent upkeep / {PER_ROOM}) |")
    per_worker = [args.core_target / (p[f"{c}:worker_ms_per_line"] / 1000 / args.line_s) for c in codecs]
    print("| speaking rooms per worker core (besides the engine) | " + " | ".join(f"{v:,.0f}" for v in per_worker)
          + f" | {args.core_target:g} / (ms per line / {args.line_s:g} s) |")
    print("| speaking rooms per GPU (ESTIMATE, not measured) | " + " | ".join(str(args.gpu_rooms) for _ in codecs)
          + " | --gpu-rooms; replace with bench/gpu_check.sh (streaming_load C100 on cuda:0) |")
    for rooms in (int(r) for r in args.model_rooms.split(",")):
        print(f"\n{rooms:,} rooms of {PER_ROOM}, a line of {args.line_s:g} s every {args.line_every_s:g} s per room "
              f"(arithmetic for {codecs[0]})\n")
        print("| what | " + " | ".join(f"{c} listeners" for c in codecs) + " | arithmetic |")
        print("|---|" + "---|" * len(codecs) + "---|")
        tables = [model(u, args, rooms, c) for c in codecs]
        for rows in zip(*tables, strict=True):
            print(f"| {rows[0][0]} | " + " | ".join(r[1] for r in rows) + f" | {rows[0][2]} |")


async def run(args: argparse.Namespace) -> None:
    raise_nofile(args.rooms * PER_ROOM * 2 + 1000)
    with tempfile.TemporaryDirectory(prefix="vx-bench-") as tmp, RedisServer() as redis:
        assert redis.process is not None
        n = str(max(4, args.rooms))
        # One context for every room, as one GPU serves them (continuous batching): the worker's
        # CPU is then what one GPU's worker process spends per line.
        worker = start_worker(redis.url, Path(tmp), engine="synthetic", contexts=1,
                              VOXROOM_SYNTHETIC_TTFC_MS="50", VOXROOM_SYNTHETIC_RTF="0.05",
                              VOXROOM_SYNTHETIC_MAX_BATCH=n, VOXROOM_SYNTHETIC_CONTINUOUS="1",
                              VOXROOM_CONTEXT_INFLIGHT=n, VOXROOM_CONTEXT_QUEUE=n)
        try:
            gateway, port = start_gateway(redis.url, Path(tmp), VOXROOM_LOG_LEVEL="WARNING")
            try:
                pids = {"redis": redis.process.pid, "gateway": gateway.pid, "worker": worker.pid}
                m = await measure(args, redis.url, port, pids)
            finally:
                gateway.stop()
        finally:
            worker.stop()
    u = unit_costs(m, args)
    print(f"\nmachine: {platform.node()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end, "
          f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
    print_units(u, args)
    print_model(u, args)
    print(f"\ncommand: .venv/bin/python bench/capacity.py --rooms {args.rooms} --lines {args.lines} "
          f"--reps {args.reps} --chars {args.chars} --idle-s {args.idle_s:g} --mem-rooms {args.mem_rooms}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rooms", type=int, default=20,
                        help="rooms measured at once (12 clients each); far fewer inflates every per-line cost")
    parser.add_argument("--lines", type=int, default=3, help="lines per room per phase, one after another")
    parser.add_argument("--chars", type=int, default=42, help="characters a line (14 a second: 42 is 3 s)")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds of each idle and silent window")
    parser.add_argument("--codecs", default="pcm16,opus")
    parser.add_argument("--mem-rooms", type=int, default=10, help="rooms for bench/redis_memory.py's measure")
    model_args = parser.add_argument_group("model (docs/deployment.md, 'Capacity model', justifies each)")
    model_args.add_argument("--model-rooms", default="10000,100000")
    model_args.add_argument("--line-s", type=float, default=3.0, help="a narrator line's length")
    model_args.add_argument("--line-every-s", type=float, default=20.0, help="one line per room every N s")
    model_args.add_argument("--redis-target", type=float, default=0.5, help="CPU of one core per primary")
    model_args.add_argument("--redis-maxmemory-gib", type=float, default=8.0, help="maxmemory per primary")
    model_args.add_argument("--redis-fixed-gib", type=float, default=0.5,
                            help="per primary, not rooms': audio cache + job stream share")
    model_args.add_argument("--core-target", type=float, default=0.7, help="CPU of one core per gateway/worker")
    model_args.add_argument("--max-connections", type=int, default=20_000, help="VOXROOM_MAX_CONNECTIONS")
    model_args.add_argument("--gpu-rooms", type=int, default=32,
                            help="speaking rooms one GPU keeps in real time: an ESTIMATE (no GPU measured)")
    args = parser.parse_args()
    try:
        import uvloop
    except ImportError:
        asyncio.run(run(args))
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(run(args))


if __name__ == "__main__":
    main()
