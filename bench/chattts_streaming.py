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

import chattts_common as common


def ours(e, text: str) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    from workers.engines.base import SynthesisRequest

    t0 = time.perf_counter()
    first = None
    n = 0
    for chunk in e.stream(SynthesisRequest(text=text, voice=common.voice(0)), threading.Event()):
        if first is None and len(chunk):
            first = time.perf_counter() - t0
        n += len(chunk)
    return first or 0.0, time.perf_counter() - t0, n


def upstream(e, text: str, steps: int) -> tuple[float, float, int]:  # type: ignore[no-untyped-def]
    t0 = time.perf_counter()
    first = None
    n = 0
    for wav in common.upstream_stream(e, text, steps):
        if first is None and wav.shape[-1]:
            first = time.perf_counter() - t0
        n += wav.shape[-1]
    return first or 0.0, time.perf_counter() - t0, n


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
    ap.add_argument("--int8", action="store_true")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--rebuild", action="store_true")
    args = ap.parse_args()
    common.quiet()
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    e = common.engine(args.size, args.device, args.int8, args.rebuild)
    text = common.TEXTS[0]
    ours(e, text)  # warm-up (numba compiles the normalizer once, allocator warms)
    rows = []
    for seconds in args.seconds:
        steps = round(seconds * common.STEPS_PER_SECOND)
        e.sampling = type(e.sampling)(min_new_tokens=steps, max_new_tokens=steps)
        o = [ours(e, text) for _ in range(args.reps)]
        u = [upstream(e, text, steps) for _ in range(args.reps)]
        o_first, o_total = statistics.median(x[0] for x in o), statistics.median(x[1] for x in o)
        u_first, u_total = statistics.median(x[0] for x in u), statistics.median(x[1] for x in u)
        audio = o[0][2] / 24000
        rows.append([f"{seconds:g} s ({steps} steps)", f"{o_first:.2f}", f"{u_first:.2f}",
                     f"{o_first / u_first:.2f}", f"{o_total:.1f}", f"{u_total:.1f}", f"{o_total / u_total:.2f}",
                     f"{o_total / audio:.2f}"])
        print(f"# {seconds:g} s done", flush=True)
    print(f"\nsize={args.size} device={args.device} int8={args.int8} threads={torch.get_num_threads()} "
          f"reps={args.reps} (median)\n")
    print(common.table(["utterance", "TTFC ours s", "TTFC upstream s", "ratio", "total ours s",
                        "total upstream s", "ratio", "RTF ours"], rows))
    err, peak = decode_error(e, 160)
    print(f"\nwindowed vs full decode, 160 steps: max |diff| {err:.2e} (peak {peak:.3f})")


if __name__ == "__main__":
    main()
