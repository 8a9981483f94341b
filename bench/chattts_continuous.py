"""ChatTTS late row: windowed vs continuous batching, through the real context (workers/pool/context.py).

    .venv/bin/python bench/chattts_continuous.py [--size full|tiny] [--gpt bf16] [--threads 2]
                                                 [--seconds 2] [--late-ms 200] [--stagger-ms 0] [--reps 1]

Four lines (each its own text and voice, forced to ``seconds * 46.875`` GPT steps: random weights
never meet EOS) go into one context at t=0 (with ``--stagger-ms``, the second to fourth that much
after the first: lines that arrive together, a fraction of a step apart), a fifth ``late_ms`` later.
The table's spread is between the first and the last of the four early lines' first audio, in time
from t=0: lines that arrive within a step of each other start in the same step (issue 28), so it is
the slicer's and the hand-offs' jitter, not a step or a piece. Windowed (what ships by
default): the four form a batch after ``batch_window_ms`` and the fifth waits for that batch to end.
Continuous (``VOXROOM_CHATTTS_CONTINUOUS=1``): the fifth joins the running batch at the next GPT step.
Times are from a line's arrival in the context's queue to its first 40 ms slice out of the
context (what a room hears, less the network), so the slicer and the context's hand-offs count.
Both modes run in the same process on the same loaded model, alternating when ``--reps`` > 1.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from typing import Any

import chattts_common as common


async def scenario(engine: Any, continuous: bool, seconds_late: float, texts: list[str],
                   stagger_s: float = 0.0) -> list[tuple[float, float]]:
    """(first audio s, last audio s) per line, each from its own arrival."""
    from voxroom.voices.catalog import Catalog
    from voxroom.wire.jobs import Job
    from workers.pool.context import Context
    from workers.utterance import SliceBuffer, Utterance

    engine.continuous = continuous
    voices = [common.voice(i) for i in range(len(texts))]
    ctx = Context("cpu#0", "cpu", {"chattts": engine}, Catalog(voices, voices[0].id), queue_size=8, inflight=16)
    runner = asyncio.create_task(ctx.run(lambda utt: None), name="bench:context")

    async def line(i: int, delay: float) -> tuple[float, float]:
        await asyncio.sleep(delay)
        job = Job(entry_id=f"{i}-0", room=f"bench-{i}", seq=1, text=texts[i], voice=voices[i].id,
                  prev_voice=voices[i].id, sender="bench", time_ms=time.time() * 1000)
        utt = Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))
        arrived = time.perf_counter()
        await ctx.queue.put(utt)
        first = None
        while await utt.slices.get() is not None:
            first = first or time.perf_counter() - arrived
        return first or float("nan"), time.perf_counter() - arrived

    engine.close = lambda: None  # ctx.close() closes its engines; this one serves the next run too
    try:
        n = len(texts)
        delays = [seconds_late if i == n - 1 else stagger_s if i else 0.0 for i in range(n)]
        return list(await asyncio.gather(*(line(i, delay) for i, delay in enumerate(delays))))
    finally:
        runner.cancel()
        ctx.close()
        del engine.close


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument("--gpt", default="bf16", choices=["fp32", "bf16", "int8"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--late-ms", type=float, default=200.0)
    ap.add_argument("--stagger-ms", type=float, default=0.0,
                    help="the second to fourth early lines arrive this much after the first")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    common.quiet()
    import torch

    torch.set_num_threads(args.threads)
    steps = round(args.seconds * common.STEPS_PER_SECOND)
    e = common.engine(args.size, args.device, int8=args.gpt == "int8", bf16=args.gpt == "bf16", steps=steps,
                      max_batch=8)
    texts = [common.TEXTS[i % len(common.TEXTS)] for i in range(5)]
    asyncio.run(scenario(e, True, 0.0, texts[:1]))  # warm-up (the normalizer's numba compile, allocator)
    results: dict[str, list[list[tuple[float, float]]]] = {"windowed": [], "continuous": []}
    for rep in range(args.reps):
        for mode in ("windowed", "continuous") if rep % 2 == 0 else ("continuous", "windowed"):
            got = asyncio.run(scenario(e, mode == "continuous", args.late_ms / 1000, texts, args.stagger_ms / 1000))
            results[mode].append(got)
            print(f"# {mode}: first audio " + " ".join(f"{f:.2f}" for f, _ in got), flush=True)
    e.close()
    rows = []
    for mode, runs in results.items():
        early = [f for run in runs for f, _ in run[:4]]
        stagger = args.stagger_ms / 1000
        spread = statistics.median(max(f + (stagger if i else 0.0) for i, (f, _) in enumerate(run[:4]))
                                   - min(f + (stagger if i else 0.0) for i, (f, _) in enumerate(run[:4]))
                                   for run in runs)
        late = statistics.median(run[4][0] for run in runs)
        late_alone_ratio = statistics.median(run[4][0] / max(f for f, _ in run[:4]) for run in runs)
        done = statistics.median(max(d + (args.late_ms / 1000 if i == 4 else 0.0) for i, (_, d) in enumerate(run))
                                 for run in runs)
        rows.append([mode, f"{min(early):.2f}-{max(early):.2f}", f"{spread:.2f}", f"{late:.2f}",
                     f"{late_alone_ratio:.2f}x", f"{done:.1f}"])
    print(f"\nsize={args.size} gpt={args.gpt} device={args.device} threads={torch.get_num_threads()} "
          f"lines=4 at t=0 (stagger {args.stagger_ms:g} ms) + 1 at {args.late_ms:g} ms, {args.seconds:g} s each "
          f"({steps} steps) reps={args.reps}\n")
    print(common.table(["batching", "first audio, 4 lines at t=0 (s)", "spread among the 4 (s)",
                        "first audio, late line (s)", "late / slowest early", "all lines done (s from t=0)"], rows))


if __name__ == "__main__":
    main()
