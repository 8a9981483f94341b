"""Offline engines: time to first chunk and real-time factor, per voice, and Piper with 1 vs 2
concurrent streams (one engine instance, one ONNX session, per thread).

    .venv/bin/python bench/engines.py --runs 20

Prints Markdown tables. The real-time factor is compute time over audio time (lower is faster;
0.05 means 20x faster than real time). Speed is measured here, never asserted in tests.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import threading
import time
from dataclasses import dataclass

from voxroom.voices.catalog import Catalog
from workers.engines.base import Engine, SynthesisRequest
from workers.engines.registry import create_engine

ENGLISH = ("The old lighthouse keeper climbed the stairs slowly every evening before dark. "
           "Nobody in the village knew why he never missed a single night.")
TEXTS = {
    "en-joe": ENGLISH,
    "en-espeak": ENGLISH,
    "cmn-espeak": "天黑请闭眼，狼人请睁眼。今晚你们要杀谁？",  # noqa: RUF001 (Chinese punctuation)
    "yue-espeak": "天黑請閉眼，狼人請睜眼。今晚你哋要殺邊個？",  # noqa: RUF001
}


@dataclass
class Run:
    ttfc_s: float
    compute_s: float
    audio_s: float

    @property
    def rtf(self) -> float:
        return self.compute_s / self.audio_s


def one_run(engine: Engine, request: SynthesisRequest) -> Run:
    started = time.perf_counter()
    first = 0.0
    samples = 0
    for chunk in engine.stream(request, threading.Event()):
        if not samples:
            first = time.perf_counter() - started
        samples += chunk.size
    return Run(first, time.perf_counter() - started, samples / engine.sample_rate)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def row(label: str, runs: list[Run], extra: str = "") -> str:
    ttfc = [r.ttfc_s * 1000 for r in runs]
    rtf = [r.rtf for r in runs]
    return (f"| {label} | {len(runs)} | {statistics.mean(r.audio_s for r in runs):.2f} | "
            f"{pct(ttfc, 50):.1f} | {pct(ttfc, 95):.1f} | {pct(rtf, 50):.4f} | {pct(rtf, 95):.4f} |{extra}")


def per_voice(catalog: Catalog, runs: int, warmup: int) -> None:
    print("| engine / voice | runs | audio s | first chunk p50 ms | p95 ms | RTF p50 | RTF p95 |")
    print("|---|---|---|---|---|---|---|")
    engines: dict[str, Engine] = {}
    for voice_id, text in TEXTS.items():
        voice = catalog.get(voice_id)
        if voice.engine not in engines:
            engines[voice.engine] = create_engine(voice.engine)
            engines[voice.engine].load("cpu")
        engine = engines[voice.engine]
        request = SynthesisRequest(text, voice, request_id="bench")
        for _ in range(warmup):
            one_run(engine, request)
        print(row(f"{voice.engine} / {voice_id}", [one_run(engine, request) for _ in range(runs)]),
              flush=True)
    for engine in engines.values():
        engine.close()


def piper_concurrency(catalog: Catalog, runs: int, warmup: int) -> None:
    print("\n| piper streams at once | runs | audio s | first chunk p50 ms | p95 ms | RTF p50 | RTF p95 "
          "| aggregate x real time |")
    print("|---|---|---|---|---|---|---|---|")
    request = SynthesisRequest(ENGLISH, catalog.get("en-joe"), request_id="bench")
    for streams in (1, 2):
        engines = [create_engine("piper") for _ in range(streams)]
        for engine in engines:
            engine.load("cpu")
            for _ in range(warmup):
                one_run(engine, request)
        results: list[list[Run]] = [[] for _ in engines]
        barrier = threading.Barrier(streams)

        def work(i: int, results: list[list[Run]] = results, engines: list[Engine] = engines,
                 barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            results[i].extend(one_run(engines[i], request) for _ in range(runs))

        threads = [threading.Thread(target=work, args=(i,), name=f"bench-piper-{i}") for i in range(streams)]
        started = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - started
        flat = [r for rs in results for r in rs]
        throughput = sum(r.audio_s for r in flat) / wall
        print(row(str(streams), flat, f" {throughput:.1f} |"), flush=True)
        for engine in engines:
            engine.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20, help="measured runs per row (default 20)")
    parser.add_argument("--warmup", type=int, default=2, help="unmeasured runs first (default 2)")
    args = parser.parse_args()
    print(f"<!-- {platform.python_implementation()} {platform.python_version()}, {os.cpu_count()} CPUs, "
          f"{time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC -->\n")
    catalog = Catalog.load()
    per_voice(catalog, args.runs, args.warmup)
    piper_concurrency(catalog, args.runs, args.warmup)


if __name__ == "__main__":
    main()
