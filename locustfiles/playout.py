"""What a listener's playout buffer would have done with the slices' arrival times (pure; no Locust).

Kept apart from the locustfile because importing Locust monkey-patches the process with gevent:
this module can be imported (and tested) anywhere.
"""

from __future__ import annotations

SLICE_MS = 40.0
BUFFER_SLICES = 3


def underruns(arrivals_ms: list[float], buffer_slices: int = BUFFER_SLICES, slice_ms: float = SLICE_MS) -> list[float]:
    """Stalls (ms) of a player that starts once ``buffer_slices`` slices are in, plays one slice
    every ``slice_ms``, and on a missing slice waits until ``buffer_slices`` are in again (or the
    utterance's last slice arrived)."""
    stalls: list[float] = []
    n = len(arrivals_ms)
    if n == 0:
        return stalls
    start, t0 = 0, arrivals_ms[min(buffer_slices - 1, n - 1)]
    for i, arrived in enumerate(arrivals_ms):
        due = t0 + (i - start) * slice_ms
        if arrived > due:
            resumed = arrivals_ms[min(i + buffer_slices - 1, n - 1)]
            stalls.append(resumed - due)
            start, t0 = i, resumed
    return stalls
