"""Scene search: exact numpy top-k (what voxroom does) against an approximate index, by catalog size.

    .venv/bin/python bench/voice_search.py                  # exact only (numpy)
    .venv/bin/pip install faiss-cpu && .venv/bin/python bench/voice_search.py --faiss

Catalogs are synthetic: each voice draws a language, gender, age, emotion and style, is embedded
like a catalog entry (app/ingress/voice_search.py), then nudged by a little noise (as hand-set
vectors would be) so that ties do not flatter any method. Queries are random scenes of 1-4 tags.
One query at a time (one scene per ``say``), k = 10, one thread (``OPENBLAS_NUM_THREADS=1``:
a gateway is one event loop; BLAS threads only add jitter on a shared 2-core machine). Recall@10
is measured against the exact answer. faiss is a benchmark-only dependency: voxroom never imports it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.ingress.voice_search import DIM, embed, features, top_k

TAGS = {
    "language": ["eng", "cmn", "yue", "jpn", "kor", "fra", "deu", "spa", "sichuan", "wuu"],
    "gender": ["male", "female", "neutral"],
    "age": ["child", "young", "adult", "elderly"],
    "emotion": ["neutral", "calm", "happy", "sad", "angry", "fearful", "excited", "tender"],
    "style": ["narrator", "storyteller", "conversational", "announcer", "character", "villain", "hero"],
}


def catalog(n: int, rng: np.random.Generator) -> np.ndarray:
    # Distinct tag combinations are few (6720): embed each once, then pick and perturb.
    combos = np.stack([embed(features({k: str(rng.choice(v)) for k, v in TAGS.items()})) for _ in range(4000)])
    rows = combos[rng.integers(0, len(combos), n)] + rng.normal(0, 0.05, (n, DIM)).astype(np.float32)
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    return rows.astype(np.float32)


def scenes(count: int, rng: np.random.Generator) -> np.ndarray:
    out = []
    for _ in range(count):
        names = rng.choice(list(TAGS), size=int(rng.integers(1, 5)), replace=False)
        out.append(embed(features({str(k): str(rng.choice(TAGS[str(k)])) for k in names})))
    return np.stack(out)


def timed(fn: Any, queries: np.ndarray) -> tuple[list[float], list[np.ndarray]]:
    times, answers = [], []
    for q in queries:
        t0 = time.perf_counter()
        answers.append(fn(q))
        times.append((time.perf_counter() - t0) * 1000)
    return times, answers


def pct(values: list[float], p: float) -> float:
    return float(np.percentile(values, p))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="100,1000,10000,100000,300000")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--faiss", action="store_true", help="also an HNSW index (faiss-cpu)")
    parser.add_argument("--ef-search", type=int, default=64, help="HNSW search breadth (recall vs time)")
    args = parser.parse_args()
    rng = np.random.default_rng(1)
    queries = scenes(args.queries, rng)
    print(f"efSearch {args.ef_search}; numpy threads: set OPENBLAS_NUM_THREADS=1 for steady numbers")
    print("| voices | exact p50 ms | exact p95 ms | matrix MB |" +
          (" HNSW build s | HNSW p50 ms | HNSW p95 ms | recall@10 |" if args.faiss else ""))
    print("|---|---|---|---|" + ("---|---|---|---|" if args.faiss else ""))
    for n in (int(s) for s in args.sizes.split(",")):
        matrix = catalog(n, rng)
        exact_t, exact = timed(lambda q, m=matrix: top_k(m, q, 10)[0], queries)
        row = f"| {n:,} | {pct(exact_t, 50):.3f} | {pct(exact_t, 95):.3f} | {matrix.nbytes / 2**20:.1f} |"
        if args.faiss:
            import faiss

            faiss.omp_set_num_threads(1)
            t0 = time.perf_counter()
            index = faiss.IndexHNSWFlat(DIM, 32, faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efConstruction = 80
            index.add(matrix)
            build = time.perf_counter() - t0
            index.hnsw.efSearch = args.ef_search
            ann_t, ann = timed(lambda q, ix=index: ix.search(q.reshape(1, -1), 10)[1][0], queries)
            # Recall against the exact top-10 scores (ties: any row with a top-10 score counts).
            recall = statistics.mean(
                len(set(a.tolist()) & set(np.flatnonzero(matrix @ q >= (matrix @ q)[e[-1]] - 1e-6).tolist())) / 10
                for q, a, e in zip(queries, ann, exact, strict=True))
            row += f" {build:.2f} | {pct(ann_t, 50):.3f} | {pct(ann_t, 95):.3f} | {recall:.3f} |"
        print(row, flush=True)


if __name__ == "__main__":
    main()
