"""The context pool: one context per GPU, or ``cpu_contexts`` CPU contexts; least-loaded dispatch."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

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
        self.freed = asyncio.Event()
        """Set whenever room opens in some context (a job left a queue, or finished publishing):
        the intake loop waits on it when :meth:`free` is 0. Not only at the end of publishing: a
        queue slot opens when synthesis takes the next job, seconds before the line has played."""
        for ctx in self.contexts:
            ctx.on_free = self.freed.set

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
        return sum(max(0, min(c.free(), c.queue.maxsize - c.queue.qsize())) for c in self.contexts)

    def adoptable(self) -> int:
        """How many jobs claimed from dead workers the pool may take past :meth:`free`."""
        return sum(c.inflight - c.adopted for c in self.contexts)

    def adopt(self, utt: Utterance, engine: str) -> Context | None:
        """Hand a claimed job to the context holding ``engine`` with the fewest adopted jobs,
        ahead of its queue (:meth:`Context.adopt`). ``None`` when none may adopt more."""
        for ctx in sorted((c for c in self.contexts if engine in c.engines), key=lambda c: c.adopted):
            if ctx.adopt(utt):
                return ctx
        return None

    def load(self) -> int:
        return sum(c.load for c in self.contexts)

    def submit(self, utt: Utterance, engine: str) -> Context | None:
        """Queue ``utt`` on the least-loaded context that holds ``engine`` (the first in pool order
        among equals). ``None`` when none of them has room: never raises. The intake loop reads
        only what :meth:`free` allows and is the only caller, so ``None`` means the contexts differ
        in engines (an optional engine failed to load on one); the caller leaves the job in Redis."""
        # One pass, stopping at the first idle context: with one context per room of a busy GPU
        # host (or 100 in the benchmark) a scan with a sort key cost more than the job's own start.
        best: Context | None = None
        best_load = 0
        for ctx in self.contexts:
            queued = ctx.queue.qsize()
            if queued >= ctx.queue.maxsize or engine not in ctx.engines:
                continue
            load = queued + ctx.active
            if best is None or load < best_load:
                best, best_load = ctx, load
                if load == 0:
                    break
        if best is None:
            return None
        best.queue.put_nowait(utt)
        return best

    def close(self) -> None:
        for ctx in self.contexts:
            ctx.close()
