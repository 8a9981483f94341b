"""Keep the garbage collector's full collections off the audio path."""

from __future__ import annotations

import gc


def freeze_startup_objects() -> None:
    """Move everything alive after start-up out of the collector's sight (``gc.freeze``).

    A worker holds torch's and its engines' hundreds of thousands of objects for as long as it
    runs; every full collection scanned them all and stopped the loop for 0.3 to 1.7 s in the
    middle of rooms' audio (docs/benchmarks.md). Frozen, they are never scanned again; cycles
    made later are still collected. Called once, when a process is ready to serve.
    """
    gc.collect()
    gc.freeze()
