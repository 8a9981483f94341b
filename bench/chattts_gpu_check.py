"""One short ChatTTS check for a lent GPU machine (runs unchanged on the CPU): TTFC ours vs upstream,
real-time factor, batch scaling. Called by ``bench/gpu_check.sh``.

    .venv/bin/python bench/chattts_gpu_check.py [--small]

``--small`` uses the tiny random model and short utterances (seconds on a CPU; what the test runs);
without it the full-size random-weight model (279.7M parameters, the real compute cost).
"""

from __future__ import annotations

import argparse
import time

import chattts_common as common


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--device", default=None, help="default: cuda:0 when available, else cpu")
    args = ap.parse_args()
    common.quiet()
    import torch

    device = args.device or ("cuda:0" if torch.cuda.is_available() else "cpu")
    size = "tiny" if args.small else "full"
    seconds = 1.0 if args.small else 4.0
    batches = [1, 2] if args.small else [1, 2, 4, 8]
    steps = round(seconds * common.STEPS_PER_SECOND)
    name = torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu"
    print(f"# device {device} ({name}), torch {torch.__version__}, model {size}, {seconds:g} s utterances",
          flush=True)
    e = common.engine(size, device, steps=steps)
    common.run_batch(e, 1)  # warm-up: kernels, allocator, numba normalizer

    wall, rows = common.run_batch(e, 1)
    ttfc = rows[0].first_chunk_s or 0.0
    audio = rows[0].samples / 24000
    t0 = time.perf_counter()
    up_first = None
    for wav in common.upstream_stream(e, common.TEXTS[0], steps):
        if up_first is None and wav.shape[-1]:
            up_first = time.perf_counter() - t0
    up_total = time.perf_counter() - t0
    print(f"TTFC ours {ttfc:.3f} s, upstream {up_first or 0:.3f} s; total ours {wall:.2f} s, upstream "
          f"{up_total:.2f} s; RTF ours {wall / audio:.3f} (B=1, {audio:.2f} s of audio)")
    base = None
    for b in batches:
        wall, rows = common.run_batch(e, b)
        tput = sum(r.samples for r in rows) / 24000 / wall
        base = base or tput
        ttfc_mean = sum(r.first_chunk_s or 0.0 for r in rows) / len(rows)
        print(f"batch {b}: {tput:.2f} audio s / wall s ({tput / base:.2f}x batch 1), TTFC mean {ttfc_mean:.3f} s")
    if device.startswith("cuda"):
        print(f"peak GPU memory {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
    print("gpu_check: ok")


if __name__ == "__main__":
    main()
