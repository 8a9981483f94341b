"""Shared bits of the ChatTTS benchmarks: a random-weight model in ChatTTS's layout, timing helpers.

The ``full`` model is the published architecture (279.7M parameters) with random weights: it says
nothing about quality but costs exactly what the real model costs. It is built once per machine into
``$TMPDIR/voxroom-chattts-<size>`` (about 1.1 GB for ``full``, ~10 s) and loaded through the same
loader users use (``source="custom"``); ``--rebuild`` forces a fresh one.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

STEPS_PER_SECOND = 46.875  # 24000 / 512: one GPT step is 512 samples


def quiet() -> None:
    # Upstream ChatTTS passes `past_key_values`, which transformers 5 deprecates (FutureWarning per call).
    warnings.filterwarnings("ignore", category=FutureWarning)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def model_dir(size: str, rebuild: bool = False) -> Path:
    from workers.engines.chattts import random_checkpoint

    root = Path(tempfile.gettempdir()) / f"voxroom-chattts-{size}"
    if rebuild or not (root / random_checkpoint.SHA256_FILE).is_file():
        t = time.perf_counter()
        random_checkpoint.build(root, size)  # type: ignore[arg-type]
        print(f"# built random {size} checkpoint in {time.perf_counter() - t:.1f} s -> {root}", flush=True)
    return root


def engine(size: str, device: str = "cpu", int8: bool = False, rebuild: bool = False,
           steps: int = 100, **options: Any) -> Any:
    from workers.engines.chattts import ChatTTSEngine

    e = ChatTTSEngine(source="custom", custom_path=str(model_dir(size, rebuild)), int8=int8,
                      min_new_tokens=steps, max_new_tokens=steps, **options)
    t = time.perf_counter()
    e.load(device)
    print(f"# loaded {size} model on {device} (int8={int8}) in {time.perf_counter() - t:.1f} s", flush=True)
    return e


def voice(i: int) -> Any:
    from voxroom.voices.catalog import Voice

    return Voice(id=f"bench-{i}", engine="chattts", language="eng", params={"seed": 100 + i})


TEXTS = ("The quick brown fox jumps over the lazy dog near the river bank.",
         "Streaming speech should start quickly and never stall in the middle.",
         "Every room hears its own voice, even when the rooms share one batch.",
         "Numbers from random weights measure cost, not how good the voice sounds.")


@dataclass
class RowTiming:
    first_chunk_s: float | None = None
    samples: int = 0
    cpu_s: float = 0.0


def run_batch(e: Any, n: int) -> tuple[float, list[RowTiming]]:
    """One ``stream_batch`` of ``n`` rows; wall seconds and per-row timings (``cpu_s`` of the batch is
    stored on the first row)."""
    from workers.engines.base import SynthesisRequest

    reqs = [SynthesisRequest(text=TEXTS[i % len(TEXTS)], voice=voice(i)) for i in range(n)]
    rows = [RowTiming() for _ in range(n)]
    t0, c0 = time.perf_counter(), time.process_time()
    for row, chunk in e.stream_batch(reqs, [threading.Event() for _ in reqs]):
        if rows[row].first_chunk_s is None:
            rows[row].first_chunk_s = time.perf_counter() - t0
        rows[row].samples += len(chunk)
    rows[0].cpu_s = time.process_time() - c0
    return time.perf_counter() - t0, rows


def upstream_stream(e: Any, text: str, steps: int) -> Iterator[Any]:
    """Upstream ``Chat.infer(stream=True)`` with the same model, voice and forced length."""
    from ChatTTS import Chat

    params = Chat.InferCodeParams(spk_emb=e.embedding(voice(0)).cpu(), min_new_token=steps,
                                  max_new_token=steps, show_tqdm=False)
    return iter(e.chat.infer(text, stream=True, skip_refine_text=True, split_text=False,
                             params_infer_code=params))


def table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)
