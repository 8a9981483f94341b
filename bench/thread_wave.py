"""What it costs to wake N Python threads at once: the floor under one context (thread) per room.

    .venv/bin/python bench/thread_wave.py [--rounds 7]

N threads wait on their own Event; the main thread sets them all and measures when each thread
ran its first Python line. Once with the main thread idle (sleeping in a join), once with it busy
running Python for 30 ms, as a worker's event loop is while a burst of rooms arrives: a thread
woken then waits for the GIL until the interpreter's switch interval (5 ms) forces a hand-over.
The worker's synthesis contexts are such threads: 100 rooms on 100 contexts pay this twice per
line (the job's hand-off, the first chunk's hand-back); one continuous-batching context pays one
thread's wake (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time


def wave(n: int, busy_main: bool) -> tuple[float, float]:
    """(median, last) ms from setting the events to each thread running."""
    events = [threading.Event() for _ in range(n)]
    ran = [0.0] * n
    ready = threading.Barrier(n + 1)

    def run(i: int) -> None:
        ready.wait()
        events[i].wait()
        ran[i] = time.perf_counter()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    ready.wait()
    time.sleep(0.05)  # every thread is blocked in its wait
    start = time.perf_counter()
    for event in events:
        event.set()
    if busy_main:
        until = start + 0.03
        while time.perf_counter() < until:
            sum(range(100))
    for t in threads:
        t.join()
    delays = sorted((r - start) * 1000 for r in ran)
    return delays[len(delays) // 2], delays[-1]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    print(f"\nthreads woken at once (median of {args.rounds} rounds; switch interval "
          f"{sys.getswitchinterval() * 1000:.0f} ms)\n")
    print("| threads | main thread | median thread runs after ms | last thread runs after ms |")
    print("|---|---|---|---|")
    for n in (1, 10, 100):
        for busy in (False, True):
            results = [wave(n, busy) for _ in range(args.rounds)]
            print(f"| {n} | {'busy' if busy else 'idle'} | {statistics.median(r[0] for r in results):.2f} "
                  f"| {statistics.median(r[1] for r in results):.2f} |")


if __name__ == "__main__":
    main()
