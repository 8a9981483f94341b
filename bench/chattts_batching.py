"""ChatTTS batching across rooms: throughput and time to first chunk at batch 1, 2, 4, 8, fp32 and int8.

    .venv/bin/python bench/chattts_batching.py [--size full|tiny] [--batches 1 2 4 8] [--seconds 2]
                                               [--modes fp32 int8] [--reps 1]

Each row is a different text and a different voice (its own speaker embedding) and is forced to
``seconds * 46.875`` GPT steps (random weights never stop at EOS). Throughput is audio seconds produced
per wall second, all rows together; TTFC is the mean over rows of the time to their first chunk.
"""

from __future__ import annotations

import argparse
import statistics

import chattts_common as common


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--modes", nargs="+", default=["fp32", "int8"], choices=["fp32", "bf16", "int8"])
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--stat", choices=["median", "min"], default="median",
                    help="min: the least disturbed repetition, for a machine shared with other jobs")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0)
    args = ap.parse_args()
    common.quiet()
    pick = statistics.median if args.stat == "median" else min
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    steps = round(args.seconds * common.STEPS_PER_SECOND)
    rows = []
    for mode in args.modes:
        e = common.engine(args.size, args.device, int8=mode == "int8", steps=steps, bf16=mode == "bf16")
        common.run_batch(e, 1)  # warm-up
        base = None
        for b in args.batches:
            runs = [common.run_batch(e, b) for _ in range(args.reps)]
            wall, timings = min(runs, key=lambda r: r[0]) if args.stat == "min" else runs[0]
            wall = pick(r[0] for r in runs)
            audio = sum(t.samples for t in timings) / 24000
            ttfc = statistics.mean(t.first_chunk_s or 0.0 for t in timings)
            ttfc_max = max(t.first_chunk_s or 0.0 for t in timings)
            tput = audio / wall
            cpu_tput = audio / timings[0].cpu_s * torch.get_num_threads()
            base = base or cpu_tput
            rows.append([mode, b, f"{tput:.2f}", f"{cpu_tput:.2f}", f"{cpu_tput / base:.2f}x", f"{ttfc:.2f}",
                         f"{ttfc_max:.2f}", f"{wall:.1f}", f"{timings[0].cpu_s:.1f}"])
            print(f"# {mode} batch {b}: {tput:.2f} audio s / s", flush=True)
        e.close()
    print(f"\nsize={args.size} device={args.device} threads={torch.get_num_threads()} "
          f"utterance={args.seconds:g} s ({steps} steps) reps={args.reps} ({args.stat})\n")
    print("audio s / CPU s x threads: the throughput this machine gives with its cores to itself\n")
    print(common.table(["GPT", "batch", "audio s / wall s", "audio s / (CPU s / threads)", "vs batch 1",
                        "TTFC mean s", "TTFC max s", "wall s", "CPU s"], rows))


if __name__ == "__main__":
    main()
