"""The context pool: one context per GPU, or ``cpu_contexts`` CPU contexts; least-loaded dispatch."""

from __future__ import annotations

import logging
from collections.abc import Callable

from voxroom.errors import Overloaded
from voxroom.voices import Catalog
from workers.context import Context
from workers.engines.base import Engine
from workers.job import Utterance

log = logging.getLogger("voxroom.worker.pool")

EngineFactory = Callable[[str], dict[str, Engine]]
"""Given a device name, a fresh set of engines (one instance per engine kind) for it."""


def detect_devices(cpu_contexts: int) -> list[str]:
    """``cuda:N`` for every visible GPU; otherwise ``cpu_contexts`` CPU contexts. torch is only
    consulted when it is installed (the light core has none)."""
    try:
        import torch
    except ImportError:
        return ["cpu"] * max(1, cpu_contexts)
    if torch.cuda.is_available():
        return [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    return ["cpu"] * max(1, cpu_contexts)


class ContextPool:
    def __init__(self, devices: list[str], make_engines: EngineFactory, catalog: Catalog, *,
                 queue_size: int = 4, inflight: int = 64, batch_window_ms: float = 15.0,
                 max_slices: int = 4096) -> None:
        self.contexts = [
            Context(f"{device}#{i}", device, make_engines(device), catalog, queue_size=queue_size,
                    inflight=inflight, batch_window_ms=batch_window_ms, max_slices=max_slices)
            for i, device in enumerate(devices)
        ]
        self._served = frozenset(self.engine_names())

    def engine_names(self) -> set[str]:
        return set().union(*(c.engines.keys() for c in self.contexts))

    def engines_loaded(self) -> None:
        """Call once the contexts loaded their engines (an optional one may have been dropped)."""
        self._served = frozenset(self.engine_names())

    def serves(self, engine: str) -> bool:
        """Asked for every job: a set lookup, not a union over every context."""
        return engine in self._served

    def free(self) -> int:
        """How many more jobs the pool can take right now (what the worker asks Redis for)."""
        return sum(min(c.free(), c.queue.maxsize - c.queue.qsize()) for c in self.contexts)

    def load(self) -> int:
        return sum(c.load for c in self.contexts)

    def submit(self, utt: Utterance) -> Context:
        """Queue on the least-loaded context (the first in pool order among equals). Raises
        :class:`Overloaded` when every queue is full
        (the worker only reads what :meth:`free` allows, so this means a bug or a race)."""
        # One pass, stopping at the first idle context: with one context per room of a busy GPU
        # host (or 100 in the benchmark) a scan with a sort key cost more than the job's own start.
        best: Context | None = None
        best_load = 0
        for ctx in self.contexts:
            queued = ctx.queue.qsize()
            if queued >= ctx.queue.maxsize:
                continue
            load = queued + ctx.active
            if best is None or load < best_load:
                best, best_load = ctx, load
                if load == 0:
                    break
        if best is None:
            raise Overloaded("every context queue is full", retry_after_ms=500)
        best.queue.put_nowait(utt)
        return best

    def close(self) -> None:
        for ctx in self.contexts:
            ctx.close()
