"""A gateway, then a worker, cut off from Redis (packets dropped both ways, the process alive):
how fast each reads again after the heal, and how fast ``/readyz`` answers during the cut (issue 32).

    sudo .venv/bin/python bench/partitions.py [--runs 3] [--gateway-cut 10] [--worker-cut 15]

Real processes in network namespaces of the bench's own (tests/support/netns.py: needs root,
``ip`` and ``iptables``), a private redis-server reachable from them, offline voices (espeak-ng).

- **Gateway cut**: 4 rooms, each with a speaker and a listener on the partitioned gateway and two
  lines said before the cut; ``/readyz`` polled through the cut (time to its answer, and which);
  after the heal: heal to the first audio frame any listener gets (the gateway's readers read
  again, the listeners are replayed what they missed), and whether every line arrived whole.
- **Worker cut**: the only worker partitioned while its blocked job read waits; a line said
  during the cut (the gateway stores it); heal to that line's first audio frame, against the same
  line's time to first audio with no cut in the same run (the baseline).

Goal of the issue: reading again within 2 s of the heal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support import netns
from tests.support.processes import base_env, start_gateway, start_worker, wait_http
from tests.support.room_client import RoomClient
from voxroom.store.server import RedisServer, free_port

VOICE = "en-espeak"
LINES = ["The night falls over the village, and everyone closes their eyes.",
         "The wolves wake, look at one another, and choose a victim in silence."]


def _readyz(url: str) -> tuple[float, int]:
    started = time.monotonic()
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            code = resp.status
    except urllib.error.HTTPError as exc:
        code = exc.code
    except OSError:
        code = 0  # no answer within 5 s
    return (time.monotonic() - started) * 1000, code


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def gateway_cut(cut_s: float, logs: Path) -> tuple[list[tuple[float, int]], float, bool]:
    """Readyz answers during the cut, heal to first frame (ms), every line whole."""
    with netns.Namespace() as ns, RedisServer(also_bind=(ns.host_ip,)) as redis:
        worker = start_worker(redis.url, logs, contexts=2)
        port = free_port()
        gateway = ns.start([sys.executable, "-m", "voxroom_cli", "gateway", "--host", ns.ip, "--port", str(port),
                            "--insecure-dev"], base_env(f"redis://{ns.host_ip}:{redis.port}/0"), logs / "gw-ns.log")
        try:
            wait_http(f"http://{ns.ip}:{port}/healthz", proc=gateway)
            while _readyz(f"http://{ns.ip}:{port}/readyz")[1] != 200:  # noqa: ASYNC110 (another process)
                await asyncio.sleep(0.2)
            async with contextlib.AsyncExitStack() as stack:
                rooms = [f"bench-cut-{i}" for i in range(4)]
                listeners = [await stack.enter_async_context(RoomClient(port, r, host=ns.ip)) for r in rooms]
                speakers = [await stack.enter_async_context(RoomClient(port, r, host=ns.ip)) for r in rooms]
                for speaker in speakers:
                    for line in LINES:
                        await speaker.say(line, voice=VOICE)
                await asyncio.gather(*(c.wait_for(lambda g: len(g.frames) >= 5, 60) for c in listeners))
                ns.cut(redis.port)
                cut_at = time.monotonic()
                answers = []
                while time.monotonic() - cut_at < cut_s:
                    answers.append(await asyncio.to_thread(_readyz, f"http://{ns.ip}:{port}/readyz"))
                    await asyncio.sleep(0.25)
                before = [len(c.got.frames) for c in listeners]
                ns.heal()
                healed_ms = time.time() * 1000
                await asyncio.gather(*(c.wait_ends(len(LINES), timeout=90) for c in listeners))
                first = min(t for c, n in zip(listeners, before, strict=True) for t in c.got.frame_times[n:n + 1])
                whole = all(
                    [f.chunk for f in c.got.frames_of(u)] == list(range(len(c.got.frames_of(u))))
                    for c in listeners for u in (1, 2))
                return answers, first - healed_ms, whole
        finally:
            with contextlib.suppress(Exception):
                ns.heal()
            gateway.stop()
            worker.stop()


async def worker_cut(cut_s: float, logs: Path) -> tuple[float, float]:
    """Baseline time to first audio (ms), heal to the first frame of the line said in the cut (ms)."""
    with netns.Namespace() as ns, RedisServer(also_bind=(ns.host_ip,)) as redis:
        gateway, port = start_gateway(redis.url, logs)
        worker = ns.start([sys.executable, "-m", "voxroom_cli", "worker", "--engine", "offline", "--contexts", "1"],
                          base_env(f"redis://{ns.host_ip}:{redis.port}/0",
                                   VOXROOM_WORKER_METRICS_PORT=str(free_port())), logs / "worker-ns.log")
        try:
            while "ready:" not in worker.log_text():  # noqa: ASYNC110 (another process)
                await asyncio.sleep(0.2)
            async with RoomClient(port, "bench-healed") as client:
                await client.say(LINES[0], voice=VOICE)  # warm: the first line of a worker is slower
                await client.wait_ends(1, timeout=60)
                n = len(client.got.frames)
                said = time.time() * 1000
                await client.say(LINES[1], voice=VOICE)
                await client.wait_ends(2, timeout=60)
                baseline = client.got.frame_times[n] - said
                ns.cut(redis.port)
                await asyncio.sleep(1.0)
                await client.say(LINES[1], voice=VOICE)
                await client.wait_for(lambda g: len(g.of("accepted")) == 3, 15)
                await asyncio.sleep(cut_s - 1.0)
                n = len(client.got.frames)
                ns.heal()
                healed = time.time() * 1000
                await client.wait_ends(3, timeout=60)
                return baseline, client.got.frame_times[n] - healed
        finally:
            with contextlib.suppress(Exception):
                ns.heal()
            worker.stop()
            gateway.stop()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gateway-cut", type=float, default=10.0)
    parser.add_argument("--worker-cut", type=float, default=15.0)
    parser.add_argument("--only", choices=("gateway", "worker"), help="one of the two cuts")
    args = parser.parse_args()
    why = netns.unavailable()
    if why:
        raise SystemExit(f"bench/partitions.py: {why}")
    with tempfile.TemporaryDirectory(prefix="voxroom-bench-partitions-") as tmp:
        logs = Path(tmp)
        if args.only != "worker":
            await _gateway_table(args.runs, args.gateway_cut, logs)
        if args.only != "gateway":
            await _worker_table(args.runs, args.worker_cut, logs)


async def _gateway_table(runs: int, cut_s: float, logs: Path) -> None:
    print(f"gateway cut {cut_s:.0f} s, 4 rooms:")
    print("| run | /readyz p50 ms | p95 ms | max ms | answers | heal to first frame ms | every line whole |")
    print("|---|---|---|---|---|---|---|")
    for n in range(1, runs + 1):
        answers, first_ms, whole = await gateway_cut(cut_s, logs)
        times = [t for t, _ in answers]
        codes = sorted({c for _, c in answers})
        print(f"| {n} | {statistics.median(times):.1f} | {_pct(times, 0.95):.1f} | {max(times):.1f} | "
              f"{'/'.join(map(str, codes))} x{len(answers)} | {first_ms:.0f} | {whole} |", flush=True)
    print()


async def _worker_table(runs: int, cut_s: float, logs: Path) -> None:
    print(f"worker cut {cut_s:.0f} s, one worker:")
    print("| run | baseline first audio ms | heal to first audio ms | ratio |")
    print("|---|---|---|---|")
    for n in range(1, runs + 1):
        baseline, healed = await worker_cut(cut_s, logs)
        print(f"| {n} | {baseline:.0f} | {healed:.0f} | {healed / baseline:.2f}x |", flush=True)


if __name__ == "__main__":
    asyncio.run(main())
