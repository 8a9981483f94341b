"""The context pool: one context per GPU, or ``cpu_contexts`` CPU contexts; least-loaded dispatch,
a room's later lines behind its first (``workers/pool/line_queue.py``: contexts take rooms in turn)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from voxroom.voices.catalog import Catalog
from workers.engines.base import Engine
from workers.pool.context import Context
from workers.utterance import Utterance

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
                 max_slices: int = 4096, backlog: int = 64, fair: bool = True) -> None:
        self.contexts = [
            Context(f"{device}#{i}", device, make_engines(device), catalog, queue_size=queue_size,
                    inflight=inflight, batch_window_ms=batch_window_ms, max_slices=max_slices,
                    backlog=backlog, fair=fair)
            for i, device in enumerate(devices)
        ]
        self.catalog = catalog
        self._served = frozenset(self.engine_names())
        self.freed = asyncio.Event()
        """Set whenever room opens in some context (a job left a queue, or finished publishing):
        the intake loop waits on it when :meth:`free` is 0. Not only at the end of publishing: a
        queue slot opens when synthesis takes the next job, seconds before the line has played."""
        for ctx in self.contexts:
            ctx.on_free = self.freed.set
            ctx.queue.buffered_ms = self.buffered_ms

    def buffered_ms(self, room: str) -> float:
        """Audio of ``room`` made here and not yet published, over every context (a room's lines
        may be synthesized by several): how soon the room runs out, what the queues schedule by."""
        if len(self.contexts) == 1:
            return self.contexts[0].buffered_ms(room)
        return sum(c.buffered_ms(room) for c in self.contexts)

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
        # Each context's share fits any job: a room's first line here or a later one (a later line
        # whose room's context has no backlog left goes elsewhere as a first line: see submit).
        return sum(max(0, min(c.free(), c.queue.room())) for c in self.contexts)

    def adoptable(self) -> int:
        """How many jobs claimed from dead workers the pool may take past :meth:`free`."""
        return sum(c.inflight - c.adopted for c in self.contexts)

    def engine_of(self, utt: Utterance) -> str | None:
        """The engine ``utt``'s voice speaks through: the one a context will run it on (``None``:
        a voice this worker does not know)."""
        voice = utt.job.voice
        return self.catalog.get(voice).engine if voice in self.catalog else None

    def _engine(self, utt: Utterance, engine: str | None) -> str | None:
        # The job's voice decides, not the caller's word for it: a context runs a job by its
        # voice, and one lacking that engine could only fail it.
        needed = self.engine_of(utt)
        if engine is not None and engine != needed:
            log.error("room %s utterance %d: submitted for engine %s, but voice %s speaks through %s",
                      utt.job.room, utt.job.seq, engine, utt.job.voice, needed)
        return needed

    def adopt(self, utt: Utterance, engine: str | None = None) -> Context | None:
        """Hand a claimed job to the context holding its engine with the fewest adopted jobs,
        ahead of its queue (:meth:`Context.adopt`). ``None`` when none may adopt more, or none
        holds the engine."""
        engine = self._engine(utt, engine)
        for ctx in sorted((c for c in self.contexts if engine in c.engines), key=lambda c: c.adopted):
            if ctx.adopt(utt):
                return ctx
        return None

    def has_lines_of(self, room: str) -> bool:
        """Some context holds a line of ``room``, queued or between synthesis and published."""
        return any(c.queue.holds(room) or room in c.playing for c in self.contexts)

    def load(self) -> int:
        return sum(c.load for c in self.contexts)

    def submit(self, utt: Utterance, engine: str | None = None) -> Context | None:
        """Queue ``utt`` on an idle context that holds its engine (:meth:`engine_of`; an
        ``engine`` given that differs is logged, not followed); else behind its room's lines
        already queued on one; else on the least-loaded one (the first in pool order among
        equals). ``None`` when none of them has room, or none holds the engine (the caller checks
        :meth:`serves` first and fails such a job itself): never raises. The intake loop reads
        only what :meth:`free` allows and is the only caller, so ``None`` otherwise means the
        contexts differ in engines (an optional engine failed to load on one); the caller leaves
        the job in Redis."""
        # One pass, stopping at the first idle context: with one context per room of a busy GPU
        # host (or 100 in the benchmark) a scan with a sort key cost more than the job's own start.
        # Otherwise a room's later lines wait on the context that has its earlier ones: spread as
        # first lines over every context, one room's flood would hold them all in turn.
        engine = self._engine(utt, engine)
        if engine is None:
            return None
        best: Context | None = None
        own: Context | None = None
        best_load = 0
        room = utt.job.room
        for ctx in self.contexts:
            if engine not in ctx.engines or not ctx.queue.fits(utt):
                continue
            load = ctx.queue.qsize() + ctx.active
            if load == 0:
                best, own = ctx, None  # idle (so it holds nothing of the room): starts at once
                break
            if own is None and ctx.queue.holds(room):
                own = ctx
            if best is None or load < best_load:
                best, best_load = ctx, load
        best = own or best
        if best is None:
            return None
        best.queue.put_nowait(utt)
        return best

    def close(self) -> None:
        for ctx in self.contexts:
            ctx.close()
