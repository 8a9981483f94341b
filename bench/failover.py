"""A Redis Cluster primary SIGKILLed while rooms speak: how long each room was silent (issue 32).

    .venv/bin/python bench/failover.py [--runs 3] [--lines 9]

Each run builds a fresh 3+3 cluster (tests/support/cluster.py) and plays the scenario of
tests/support/failover.py: two rooms on every primary, two gateways, two workers (``--engine
synthetic``), speakers with two lines in flight resending after ``unavailable``; once every room
began its third line one primary is SIGKILLed. The first run is the no-fault control (the same
load, nothing killed). Printed per run: the promotion time (kill to a surviving node naming a new
primary for the victim's slots), and the longest silence a listener heard after the kill (gap
between two audio frames), worst room of the victims and of the survivors, with the two goals
of issue 32: survivors within the control's silence + 1 s, victims within promotion + claim time
(``VOXROOM_CLAIM_IDLE_MS``, 5 s) + 2 s.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.cluster import killable_cluster
from tests.support.failover import FailoverRun, run_primary_kill
from voxroom.runtime.settings import Settings


async def one(lines: int, kill: bool) -> FailoverRun:
    with killable_cluster(prefix="voxroom-bench-failover-") as cluster, \
            tempfile.TemporaryDirectory(prefix="voxroom-bench-failover-logs-") as logs:
        return await run_primary_kill(cluster, Path(logs), lines=lines, kill=kill)


def _worst(rooms: list, since_ms: float) -> float:
    return max((r.longest_silence_ms(since_ms) for r in rooms), default=0.0) / 1000


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3, help="runs with a kill, after the control")
    parser.add_argument("--lines", type=int, default=9)
    args = parser.parse_args()
    claim_s = Settings().claim_idle_ms / 1000

    control = await one(args.lines, kill=False)
    control_s = _worst(control.rooms, control.killed_ms or 0)
    print(f"control (no kill): longest silence after line {3}: {control_s:.2f} s (worst of {len(control.rooms)} rooms)")
    print()
    print("| run | promotion s | victims' longest silence s | goal s | survivors' longest silence s | goal s | "
          "unavailable (victims / survivors) |")
    print("|---|---|---|---|---|---|---|")
    victims_s, survivors_s, promotions = [], [], []
    for n in range(1, args.runs + 1):
        run = await one(args.lines, kill=True)
        assert run.killed_ms is not None and run.promoted_ms is not None
        promotion = (run.promoted_ms - run.killed_ms) / 1000
        v, s = _worst(run.victims(), run.killed_ms), _worst(run.survivors(), run.killed_ms)
        refused_v = sum(len(r.replies("error", "unavailable")) for r in run.victims())
        refused_s = sum(len(r.replies("error", "unavailable")) for r in run.survivors())
        print(f"| {n} | {promotion:.2f} | {v:.2f} | {promotion + claim_s + 2:.2f} | {s:.2f} | {control_s + 1:.2f} | "
              f"{refused_v} / {refused_s} |", flush=True)
        victims_s.append(v)
        survivors_s.append(s)
        promotions.append(promotion)
    print()
    print(f"median: promotion {statistics.median(promotions):.2f} s, victims {statistics.median(victims_s):.2f} s, "
          f"survivors {statistics.median(survivors_s):.2f} s (control {control_s:.2f} s)")


if __name__ == "__main__":
    asyncio.run(main())
