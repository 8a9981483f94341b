"""Swarm: the largest Locust swarm this machine holds with p99 time-to-first-audio within 2x the engine's.

Starts a private redis-server, one synthetic worker (``--engine synthetic``: a fixed time to first
chunk and real-time factor, so the server is measured, not a voice) with plenty of contexts, and
one gateway; then runs ``locustfiles/voxroom_swarm.py`` headless at growing user counts (rooms of
12, one speaker each) and reads Locust's final stats (``--json-file``). A step *holds* when
``say->first audio`` p99 is within ``2 x`` the engine's own first-chunk time and nothing failed. The load generator (the
Locust process) must stay below 80 % of one core, else the step is void: it measured Locust.

    .venv/bin/python bench/swarm.py --steps 24,48,96,192,288 --seconds 20 --engine-ttfc-ms 200
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from tests.support.locust_stats import Entry, final_stats, json_file_args, total_failures  # noqa: E402
from tests.support.processes import start_gateway, start_worker  # noqa: E402
from voxroom.runtime.settings import Settings  # noqa: E402
from voxroom.store.server import RedisServer  # noqa: E402

DEFAULT_TTFC_MS = 50.0  # workers/engines/synthetic.py


def locust_step(port: int, users: int, seconds: float, out: Path) -> tuple[dict[str, Entry], float, int]:
    prefix = out / f"u{users}"
    args = [sys.executable, "-m", "locust", "-f", str(ROOT / "locustfiles" / "voxroom_swarm.py"), "--headless",
            "-u", str(users), "-r", str(max(1, users // 4)), "-t", f"{seconds:.0f}s",
            "--host", f"ws://127.0.0.1:{port}", *json_file_args(prefix), "--stop-timeout", "5",
            "--loglevel", "WARNING"]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ps = psutil.Process(proc.pid)
    samples: list[float] = []
    ps.cpu_percent()
    time.sleep(max(1.0, users / max(1, users // 4)) + 1.0)  # after the ramp
    while proc.poll() is None:
        time.sleep(1.0)
        try:
            samples.append(ps.cpu_percent())
        except psutil.NoSuchProcess:
            break
    proc.wait()
    stats = final_stats(prefix)
    # The busiest steady second decides: Locust is one gevent process, one core at most.
    cpu = sorted(samples)[int(0.9 * (len(samples) - 1))] if samples else float("nan")
    return stats, cpu, proc.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", default="24,48,96,192,288", help="user counts, ascending (rooms of 12)")
    parser.add_argument("--seconds", type=float, default=20.0, help="run time per step")
    parser.add_argument("--engine-ttfc-ms", type=float, default=200.0,
                        help="the synthetic engine's first-chunk time (needs VOXROOM_SYNTHETIC_TTFC_MS)")
    parser.add_argument("--contexts", type=int, default=32, help="synthetic worker contexts (sleeping threads)")
    args = parser.parse_args()
    env: dict[str, str] = {"VOXROOM_CONTEXT_INFLIGHT": "4"}  # INFO: start_worker waits for "ready:"
    ttfc = args.engine_ttfc_ms
    if "VOXROOM_SYNTHETIC_TTFC_MS" in Settings.env_names():
        env["VOXROOM_SYNTHETIC_TTFC_MS"] = f"{ttfc:g}"
    else:
        print(f"this checkout cannot set the synthetic engine's TTFC; using its default {DEFAULT_TTFC_MS:g} ms")
        ttfc = DEFAULT_TTFC_MS
    budget = 2 * ttfc
    rows = []
    with tempfile.TemporaryDirectory(prefix="vx-swarm-") as tmp, RedisServer() as redis:
        out = Path(tmp)
        worker = start_worker(redis.url, out, engine="synthetic", contexts=args.contexts, **env)
        gateway, port = start_gateway(redis.url, out, VOXROOM_LOG_LEVEL="WARNING")
        try:
            for users in [int(s) for s in args.steps.split(",")]:
                stats, cpu, _rc = locust_step(port, users, args.seconds, out)
                first = stats.get("say->first audio", Entry("say->first audio"))
                fails = total_failures(stats)
                underrun = stats["underrun"].requests if "underrun" in stats else 0
                p50, p95, p99 = (first.percentile(q) for q in (0.50, 0.95, 0.99))
                void = not cpu < 80.0
                holds = (not void) and fails == 0 and p99 <= budget
                rows.append((users, users // 12, first.requests, p50, p95, p99, fails, underrun,
                             cpu, "VOID (load generator >= 80 % CPU)" if void else ("yes" if holds else "no")))
                print(f"step {users}: {rows[-1]}", flush=True)
                if void:  # a bigger swarm would only measure Locust harder
                    break
        finally:
            gateway.stop()
            worker.stop()
    print(f"\nLocust swarm (rooms of 12, 1 speaker + 11 listeners, 20-char lines, 400 ms pauses), synthetic "
          f"engine TTFC {ttfc:g} ms: holds when say->first audio p99 <= {budget:g} ms, no failure, and Locust "
          f"< 80 % CPU\n")
    print("| users | rooms | lines | say->first audio p50 ms | p95 ms | p99 ms | failures | underruns (3-slice) "
          "| Locust CPU % (p90 of 1 s samples) | holds |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]:.0f} | {r[4]:.0f} | {r[5]:.0f} | {r[6]} | {r[7]} | {r[8]:.0f} "
              f"| {r[9]} |")
    print(f"\ncommand: .venv/bin/python bench/swarm.py --steps {args.steps} --seconds {args.seconds:.0f} "
          f"--engine-ttfc-ms {args.engine_ttfc_ms:g}")


if __name__ == "__main__":
    main()
