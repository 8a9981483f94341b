"""ChatTTS streaming, ours vs upstream ``infer(stream=True)``, same model, voice and length, same run.

    .venv/bin/python bench/chattts_streaming.py [--size full|tiny] [--seconds 3 12] [--reps 1] [--int8]

Random weights never stop at EOS, so every utterance is forced to exactly ``seconds * 46.875`` GPT
steps (``min_new_tokens = max_new_tokens``). Time to first chunk (TTFC) and total compute are wall
seconds on this machine; ``--reps`` takes the median. Also prints how far the windowed decode is from
one full decode of the same hidden states on this model (the streaming tolerance).
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Iterator
from typing import Any

import chattts_common as common

Timing = tuple[float, float, float, float, int]
"""(first chunk wall s, first chunk CPU s, total wall s, total CPU s, samples)."""


def _measure(chunks: Iterator[Any]) -> Timing:
    # CPU seconds (process time, all threads) are what a shared machine cannot inflate much; wall
    # seconds are what a listener waits. Both are reported.
    w0, c0 = time.perf_counter(), time.process_time()
    first: tuple[float, float] | None = None
    n = 0
    for chunk in chunks:
        if first is None and chunk.shape[-1]:
            first = (time.perf_counter() - w0, time.process_time() - c0)
        n += chunk.shape[-1]
    fw, fc = first or (0.0, 0.0)
    return fw, fc, time.perf_counter() - w0, time.process_time() - c0, n


def ours(e: Any, text: str) -> Timing:
    from workers.engines.base import SynthesisRequest

    return _measure(iter(e.stream(SynthesisRequest(text=text, voice=common.voice(0)), threading.Event())))


def upstream(e: Any, text: str, steps: int) -> Timing:
    return _measure(common.upstream_stream(e, text, steps))


def decode_error(e, steps: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """Max |windowed - full decode| and the full decode's peak, on ``steps`` sampled hidden states."""
    import numpy as np
    import torch

    from workers.engines.chattts.generation import RowProgress, SamplingParams
    from workers.engines.chattts.streaming import IncrementalDecoder

    rows = [RowProgress()]
    params = SamplingParams(min_new_tokens=steps, max_new_tokens=steps)
    for _ in e._gen.run(["decode error"], [e.embedding(common.voice(0))], params, rows, lambda i: False):
        pass
    h = rows[0].hiddens
    full = e._decode(torch.stack(h))
    d = IncrementalDecoder(e._decode, e.stream_config)
    out = [d.emit(h[:t], t == len(h)) for t in range(1, len(h) + 1) if t == len(h) or d.ready(t)]
    return float(np.abs(np.concatenate(out) - full).max()), float(np.abs(full).max())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument("--seconds", type=float, nargs="+", default=[3.0, 12.0])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--stat", choices=["median", "min"], default="median",
                    help="min: the least disturbed repetition, for a machine shared with other jobs")
    ap.add_argument("--int8", action="store_true", help="int8 GPT for both ours and upstream")
    ap.add_argument("--ours-bf16", action="store_true",
                    help="ours with a bf16 GPT (a second engine); upstream stays fp32")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rebuild", action="store_true")
    args = ap.parse_args()
    common.quiet()
    pick = statistics.median if args.stat == "median" else min
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    e = common.engine(args.size, args.device, args.int8, args.rebuild)
    mine = common.engine(args.size, args.device, bf16=True) if args.ours_bf16 else e
    text = common.TEXTS[0]
    ours(mine, text)  # warm-up (numba compiles the normalizer once, allocator warms)
    rows = []
    for seconds in args.seconds:
        steps = round(seconds * common.STEPS_PER_SECOND)
        mine.sampling = e.sampling = type(e.sampling)(min_new_tokens=steps, max_new_tokens=steps)
        o: list[Timing] = []
        u: list[Timing] = []
        for _ in range(args.reps):  # interleaved, so that a noisy neighbour hits both alike
            o.append(ours(mine, text))
            u.append(upstream(e, text, steps))
        med = [[pick(x[k] for x in runs) for k in range(4)] for runs in (o, u)]
        (ofw, ofc, otw, otc), (ufw, ufc, utw, utc) = med
        audio = o[0][4] / 24000
        rows.append([f"{seconds:g} s ({steps} steps)", f"{ofw:.2f} / {ufw:.2f}", f"{ofw / ufw:.2f}",
                     f"{ofc:.2f} / {ufc:.2f}", f"{ofc / ufc:.2f}", f"{otw:.1f} / {utw:.1f}", f"{otw / utw:.2f}",
                     f"{otc:.1f} / {utc:.1f}", f"{otc / utc:.2f}", f"{otw / audio:.2f}"])
        print(f"# {seconds:g} s done: {rows[-1]}", flush=True)
    print(f"\nsize={args.size} device={args.device} int8={args.int8} ours_bf16={args.ours_bf16} "
          f"threads={torch.get_num_threads()} "
          f"reps={args.reps} ({args.stat} of each column), ours / upstream\n")
    print(common.table(["utterance", "TTFC wall s", "ratio", "TTFC CPU s", "ratio", "total wall s", "ratio",
                        "total CPU s", "ratio", "RTF ours (wall)"], rows))
    err, peak = decode_error(e, 160)
    print(f"\nwindowed vs full decode, 160 steps: max |diff| {err:.2e} (peak {peak:.3f})")


if __name__ == "__main__":
    main()
