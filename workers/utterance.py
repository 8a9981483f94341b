"""One utterance on its way through a worker: its job, its slices, its voice switch."""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from voxroom.voices.catalog import Catalog, Voice
from voxroom.wire.jobs import Job
from workers.engines.marks import WordMark


class Switch(NamedTuple):
    """What a job's voice switch asks of the engine (``SynthesisRequest`` fields of the same names)."""
    previous_voice: Voice | None
    switch_range: tuple[float, float]


NO_SWITCH = Switch(None, (0.0, 1.0))


def switch_of(job: Job, catalog: Catalog) -> Switch:
    """The switch ``job`` is part of: the voice it moves from, and the part of the path this line
    covers (line k of L: ``(k/L, (k+1)/L)``, so the switch's last line ends on the new voice).
    :data:`NO_SWITCH` when there is none or the old voice is not in ``catalog`` (retired)."""
    if not job.switch_from or job.switch_from == job.voice or job.switch_from not in catalog:
        return NO_SWITCH
    k, lines = job.switch_line, job.switch_lines
    return Switch(catalog.get(job.switch_from), (k / lines, (k + 1) / lines))


MAX_UTTERANCE_SLICES = 4096
"""About 164 s of 40 ms slices: far above what MAX_TEXT_CHARS can say, so only a runaway engine
reaches it (and is cut there)."""


class SliceBuffer:
    """Slices handed from a synthesis thread to the event loop.

    ``put``/``extend``/``close`` are called from the synthesis thread; ``get``, ``has_next`` and
    ``next_is_end`` run on the loop. The items live in one ``deque`` (its appends and pops are
    atomic), and the thread wakes the loop only when no wake is already on its way: one
    ``call_soon_threadsafe`` (a write to the loop's self-pipe, and the GIL handed over) per burst
    of slices instead of one per slice. At 100 rooms at once that per-slice hop was a good part of
    what the loop spent (docs/benchmarks.md). It holds at most :data:`MAX_UTTERANCE_SLICES` (the
    synthesis side stops producing there), so it never blocks the thread.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._items: deque[npt.NDArray[np.int16]] = deque()
        self._closed = False
        self._ready = asyncio.Event()
        self._wake_pending = False
        self.produced = 0
        self._marks: deque[WordMark] = deque()
        self._noticed = False

    def add_marks(self, marks: Iterable[WordMark]) -> None:
        """Word marks of this utterance (times from its first sample), from the synthesis thread.
        No wake: most engines give each mark before the chunk that holds its start
        (``TimedEngine``), so the publisher finds it when it takes that chunk's slice; marks
        that come later (an estimate after its audio, ChatTTS's piece marks) go out with the
        next slice or the end."""
        self._marks.extend(marks)

    def take_marks(self) -> list[WordMark]:
        """The marks added since the last call (on the loop)."""
        out: list[WordMark] = []
        while self._marks:
            out.append(self._marks.popleft())
        return out

    def put(self, item: npt.NDArray[np.int16]) -> None:
        self.extend((item,))

    def extend(self, items: Sequence[npt.NDArray[np.int16]]) -> None:
        if not items:
            return
        self.produced += len(items)
        self._items.extend(items)
        self._wake()

    def close(self) -> None:
        self._closed = True
        self._wake()

    def _wake(self) -> None:
        # Items are appended before the flag is read, and the loop clears the flag before it looks
        # at the items: an item is either seen by a wake already scheduled, or schedules its own.
        if not self._wake_pending:
            self._wake_pending = True
            try:
                self._loop.call_soon_threadsafe(self._on_wake)
            except RuntimeError:  # the worker is shutting down and its loop is closed: nobody listens
                pass

    def _on_wake(self) -> None:
        self._wake_pending = False
        self._ready.set()

    async def get(self) -> npt.NDArray[np.int16] | None:
        """The next slice, or ``None`` once the producer closed and everything was taken."""
        while not self._items and not self._closed:
            self._ready.clear()
            await self._ready.wait()
        return self._items.popleft() if self._items else None

    def notice(self) -> None:
        """Wake :meth:`get_or_notice` without a slice (an open line has something to tell the room:
        a piece of text, a flush answered). From the loop or the synthesis thread."""
        self._noticed = True
        self._wake()

    async def get_or_notice(self) -> npt.NDArray[np.int16] | Literal["notice"] | None:
        """As :meth:`get`, or ``"notice"`` when :meth:`notice` was called while nothing waits."""
        while not self._items and not self._closed and not self._noticed:
            self._ready.clear()
            await self._ready.wait()
        if self._items:
            return self._items.popleft()
        if self._noticed and not self._closed:
            self._noticed = False
            return "notice"
        return None

    def has_next(self) -> bool:
        """A slice is already waiting (so publishing it now costs no wait)."""
        return bool(self._items)

    def pending(self) -> int:
        """Slices made and not yet taken (read from the loop while the thread appends: ``len`` of
        a ``deque`` is atomic)."""
        return len(self._items)

    def next_is_end(self) -> bool:
        """Nothing is waiting and the producer is done: the slice just taken was the last."""
        return self._closed and not self._items


Source = Literal["engine", "cache"]
"""What fills an utterance's slices: its engine, or the audio cache."""


@dataclass(slots=True)
class Utterance:
    """A job in flight: the synthesis thread fills ``slices``; the publisher drains it.

    ``slices`` is bounded by the longest utterance a worker will make (see
    ``MAX_UTTERANCE_SLICES``), so the synthesis thread never blocks on it and a context is never
    held hostage by a room waiting for its turn.
    """

    job: Job
    slices: SliceBuffer
    cancel: threading.Event = field(default_factory=threading.Event)
    error: str | None = None
    engine_first_chunk_ms: float | None = None
    synth_started_ms: float | None = None
    """Room-clock time the engine was called (``job.time_ms`` is when the gateway accepted it)."""
    read_ms: float | None = None
    """Room-clock time this worker read the job from Redis."""
    source: Source | None = None
    """Who fills ``slices``, decided once by :meth:`claim`."""
    adopted: bool = False
    """Claimed from a dead worker and held past the context's bounds (workers/pool/context.py)."""
    texts: deque[tuple[int, str]] = field(default_factory=deque)
    """An open line's pieces to echo to the room (``text`` messages: offset, text), in order;
    filled by its feed (workers/intake/open_lines.py), drained by the publisher."""
    flush_acks: deque[tuple[int, int]] = field(default_factory=deque)
    """An open line's flushes to answer: (slices that must be published first, the part)."""
    lost: bool = False
    """Another worker owns the job now (Redis said so): drop it, write nothing more for it."""
    _claim_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def claim(self, source: Source) -> bool:
        """Make ``source`` the one that fills ``slices``, unless the other already is; ``True``
        when ``source`` owns them. A continuous engine starts a line while its cache lookup is
        still out (workers/pool/context.py): whichever has audio first owns the line, so its slices
        are never a mix of the two, and the loser stops (the engine's row) or steps aside (a hit
        that came too late)."""
        if self.source is None:
            with self._claim_lock:
                if self.source is None:
                    self.source = source
        return self.source == source
