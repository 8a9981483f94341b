"""Idle room WebSockets one gateway process holds, and the memory each costs.

Starts a private redis-server and one ``voxroom gateway`` process (open-file limit raised), opens
``--connections`` WebSockets in rooms of 12 from this process (a minimal client, so the load
generator is cheap), holds them ``--hold`` seconds, and reports: connect time (open to ``welcome``)
percentiles, the gateway's resident memory growth per connection (measured from a 200-connection
baseline, so imports and the first readers are not counted), and whether every connection
survived the hold (the gateway's own ``voxroom_connections`` must equal the count).

    .venv/bin/python bench/idle_connections.py --connections 10000
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _wsclient import Listener, connect, percentiles, raise_nofile  # noqa: E402

from tests.support.processes import Proc, base_env, start_gateway, wait_http  # noqa: E402
from voxroom.store.server import RedisServer, free_port  # noqa: E402

BASELINE = 200
# `voxroom gateway` as the CLI configures it, but with another uvicorn WebSocket implementation:
# to compare their memory per connection without changing the CLI.
LAUNCH = """
import sys, uvicorn
from app.main import create_app
from voxroom.runtime.settings import Settings
uvicorn.run(create_app(Settings.from_env()), host="127.0.0.1", port=int(sys.argv[1]), ws=sys.argv[2],
            log_level="warning", ws_max_size=64 * 1024, ws_ping_interval=20.0, ws_ping_timeout=20.0, lifespan="on")
"""


def start_gateway_ws(redis_url: str, log_dir: Path, ws: str, **env: str) -> tuple[Proc, int]:
    port = free_port()
    proc = Proc([sys.executable, "-c", LAUNCH, str(port), ws], base_env(redis_url, **env), log_dir / "gateway.log")
    wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
    return proc, port
PER_ROOM = 12


def gateway_connections(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith("voxroom_connections{"):
                return int(float(line.rsplit(" ", 1)[1]))
    raise RuntimeError("no voxroom_connections in /metrics")


async def open_many(port: int, start: int, count: int, concurrency: int, out: list[Listener],
                    times: list[float]) -> int:
    sem = asyncio.Semaphore(concurrency)
    failures = 0

    async def one(i: int) -> None:
        nonlocal failures
        async with sem:
            t0 = time.perf_counter()
            try:
                out.append(await connect("127.0.0.1", port, f"/rooms/idle-{i // PER_ROOM}/ws?client=c{i}"))
                times.append((time.perf_counter() - t0) * 1000)
            except (OSError, ConnectionError, TimeoutError):
                failures += 1

    await asyncio.gather(*(one(i) for i in range(start, start + count)))
    return failures


async def run(args: argparse.Namespace) -> None:
    limit = raise_nofile(args.connections * 2 + 1000)  # the gateway child inherits it
    with tempfile.TemporaryDirectory(prefix="vx-bench-") as tmp, RedisServer() as redis:
        env = {"VOXROOM_LOG_LEVEL": "WARNING", "VOXROOM_MAX_CONNECTIONS": str(args.connections + 1000),
               "VOXROOM_MAX_CONNECTIONS_PER_ADDRESS": "0"}  # every socket from this machine
        if args.ws == "cli":
            gateway, port = start_gateway(redis.url, Path(tmp), **env)
        else:
            gateway, port = start_gateway_ws(redis.url, Path(tmp), args.ws, **env)
        try:
            gw = psutil.Process(gateway.pid)
            listeners: list[Listener] = []
            times: list[float] = []
            await open_many(port, 0, BASELINE, args.concurrency, listeners, times)
            await asyncio.sleep(1.0)
            rss0 = gw.memory_info().rss
            cpu0 = sum(gw.cpu_times()[:2])
            t0 = time.perf_counter()
            times.clear()
            failures = await open_many(port, BASELINE, args.connections - BASELINE, args.concurrency, listeners, times)
            elapsed = time.perf_counter() - t0
            cpu_connect = sum(gw.cpu_times()[:2]) - cpu0
            await asyncio.sleep(2.0)
            rss1 = gw.memory_info().rss
            await asyncio.sleep(max(0.0, args.hold - 2.0))
            held = await asyncio.to_thread(gateway_connections, port)
            closed = sum(1 for c in listeners if c.closed is not None)
            rss2 = gw.memory_info().rss
            per_conn = (max(rss1, rss2) - rss0) / max(1, len(listeners) - BASELINE)
            p50, p95, p99 = percentiles(times)
            print(f"\nidle connections on one gateway process (uvicorn ws: {args.ws}, open-file limit {limit}, "
                  f"{args.concurrency} connects in flight, rooms of {PER_ROOM}, hold {args.hold:.0f} s)\n")
            print("| connections | failed | held after hold | closed by server | connect p50 ms | p95 ms | p99 ms "
                  "| connects/s | gateway CPU s / 1k connects | RSS MiB | KB per connection |")
            print("|---|---|---|---|---|---|---|---|---|---|---|")
            print(f"| {len(listeners)} | {failures} | {held} | {closed} | {p50:.1f} | {p95:.1f} | {p99:.1f} "
                  f"| {(len(listeners) - BASELINE) / elapsed:.0f} | {cpu_connect / max(1, len(times)) * 1000:.2f} "
                  f"| {max(rss1, rss2) / 2**20:.0f} | {per_conn / 1024:.1f} |")
            print(f"\ncommand: .venv/bin/python bench/idle_connections.py --connections {args.connections} "
                  f"--hold {args.hold:.0f} --ws {args.ws}")
            for c in listeners:
                c.close()
            await asyncio.sleep(0.5)
        finally:
            gateway.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--connections", type=int, default=10_000)
    parser.add_argument("--concurrency", type=int, default=200, help="connects in flight at once")
    parser.add_argument("--hold", type=float, default=30.0, help="seconds to hold them all open (> ping interval)")
    parser.add_argument("--ws", default="cli", choices=["cli", "websockets", "websockets-sansio", "wsproto"],
                        help="cli: `voxroom gateway` as shipped (uvicorn auto = websockets); else that implementation")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
