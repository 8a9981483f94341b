"""Continuous engines' rows: one serving thread per engine, lines handed to it through an inbox.

A continuous engine (``ContinuousEngine``) runs one long call, ``stream_continuous``, for as long
as its context lives; a new line joins the running batch at the engine's next step. The threads
and their inboxes are owned here and nowhere else: :meth:`ContinuousRows.admit` hands a line over
(starting the thread on first use), the thread ends its rows (``workers/pool/row_audio.py``) and, when
the engine fails or the context closes, every line handed to it. The next line starts a new one.

**Places.** An engine holds at most :func:`places` lines not yet finished: its ``max_batch`` rows
and :data:`SPARE_ROWS` more. The rest stay in the context's ``JobQueue``, so the queue's order
(rooms in turn, the room that runs out of audio soonest first) decides which line takes the next
free row, not the engine's own FIFO: before, every line taken went into that FIFO at once, and a
room with 16 lines queued filled it ahead of every room that spoke after it (issue 14). A line
holds its place from :meth:`ContinuousRows.admit` until its row ends (EOS, cancel, the length
cut, the engine's failure) or it is drained from the inbox of a thread that died; the count is
kept on the event loop (the thread reports each end with ``call_soon_threadsafe``), so the
context's runner reads an exact figure without a lock.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Hashable
from typing import TypeGuard

from workers.engines.base import ContinuousEngine, Engine, SynthesisRequest
from workers.pool.batching import batches
from workers.pool.cache_race import CachedAudio
from workers.pool.row_audio import Meter, Row
from workers.utterance import Utterance

log = logging.getLogger("voxroom.worker.context")

Inbox = queue.SimpleQueue[Utterance | None]
"""Lines for a serving thread; ``None`` tells it to stop."""

SPARE_ROWS = 1
"""Lines an engine holds beyond its ``max_batch`` rows, waiting to join. One, so that when a row
ends the engine fills it at its next step from the line already waiting, while the loop picks
the line after (a GPU step is 10-25 ms; a loop busy publishing 100 rooms can take longer than
that to answer the row's end). Not more: each spare line is a line committed before the queue
knows what comes next; a room that starts to speak then waits for one more row to end per spare
line (at ``max_batch`` 8 and 3 s lines, 140 steps each, a row ends every 18 steps: about 0.35 s
at an estimated 20 ms a step on a GPU, none measured yet). Two rows
ending in the same step leave one row empty for the loop's answer: a step's fraction, not a line."""


def places(engine: Engine) -> int:
    """Lines a continuous engine may hold not yet finished (see the module docstring)."""
    return int(getattr(engine, "max_batch", 1)) + SPARE_ROWS


def continuous(engine: Engine) -> TypeGuard[ContinuousEngine]:
    """An engine that takes rows while it runs (``continuous`` set and ``max_batch`` > 1)."""
    return bool(getattr(engine, "continuous", False)) and batches(engine)


class ContinuousRows:
    """The serving threads of one context's continuous engines, by engine name.

    ``request`` builds a line's ``SynthesisRequest`` (the context's one builder); ``cached``
    receives each whole line's audio; ``meter`` counts the audio made; ``on_place`` is called (on
    the loop) when a line leaves an engine and its place is free.
    """

    def __init__(self, name: str, request: Callable[[Utterance], SynthesisRequest], cached: CachedAudio,
                 meter: Meter, *, max_slices: int, on_place: Callable[[], None] = lambda: None) -> None:
        self.name = name
        self.request = request
        self.cached = cached
        self.meter = meter
        self.max_slices = max_slices
        self.on_place = on_place
        self._held: dict[str, int] = {}
        """Lines handed to each engine and not finished, by engine name (on the loop only)."""
        self._served: dict[str, Inbox] = {}
        """Live serving threads' inboxes, by engine name. A thread removes its own entry (under
        ``_lock``) before it fails what is left in its inbox, and :meth:`admit` puts under the
        same lock: a line is either in a live thread's inbox or in the drain of a dying one,
        never in the inbox of a thread that is gone."""
        self._lock = threading.Lock()
        self._handing = False

    def held(self, engine: Engine) -> int:
        """Lines ``engine`` holds not yet finished."""
        return self._held.get(engine.name, 0)

    def has_place(self, engine: Engine) -> bool:
        """``engine`` may take one more line now (:func:`places`)."""
        return self._held.get(engine.name, 0) < places(engine)

    def admit(self, engine: ContinuousEngine, utt: Utterance) -> None:
        """Hand ``utt`` to the engine's serving thread (started on first use): it joins the
        running batch at the engine's next step, and holds a place until its row ends. The caller
        checks :meth:`has_place` first. No await: the runner takes the next job at once."""
        self._held[engine.name] = self._held.get(engine.name, 0) + 1
        with self._lock:
            inbox = self._served.get(engine.name)
            if inbox is None:
                inbox = queue.SimpleQueue()
                thread = threading.Thread(target=self._serve, args=(engine, inbox, asyncio.get_running_loop()),
                                          name=f"vx-{self.name}-{engine.name}", daemon=True)
                self._served[engine.name] = inbox
                thread.start()
            inbox.put(utt)
        # Let the engine's thread take the GIL (sleep releases it) once this loop turn has handed
        # over what it had: the rows the runner admitted in the turn (one read's worth of a
        # burst) start at the engine's next wake-up, not when the loop next blocks, which in a
        # burst is after the next reads' admission too. A hand-over per row instead made the loop
        # wait for the engine thread's wake-up once per line, about 150 us each on two busy
        # cores: per turn, a burst of 100 rooms costs the worker 15 to 29 % less CPU per line
        # (docs/benchmarks.md, "The burst again").
        if not self._handing:
            self._handing = True
            asyncio.get_running_loop().call_soon(self._hand)

    def _hand(self) -> None:
        self._handing = False
        time.sleep(0)  # the GIL goes to a thread waiting for it; back when that one blocks

    def _left(self, name: str) -> None:
        """A line left engine ``name`` (on the loop): its place is free."""
        self._held[name] -= 1
        self.on_place()

    def close(self) -> None:
        """Tell every serving thread to stop once its engine asks for rows."""
        with self._lock:
            for inbox in self._served.values():
                inbox.put(None)

    def _serve(self, engine: ContinuousEngine, inbox: Inbox, loop: asyncio.AbstractEventLoop) -> None:
        """The engine's thread: one call to ``stream_continuous``, rows coming in through
        ``inbox``, each row fed and finished as a windowed batch's are. Every line taken from
        the inbox is reported once to :meth:`_left` when it ends, whichever way it ends."""
        rows: dict[Hashable, Row] = {}

        def left() -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the worker is gone
                loop.call_soon_threadsafe(self._left, engine.name)

        def admit(timeout: float | None) -> list[tuple[Hashable, SynthesisRequest, threading.Event]] | None:
            taken: list[Utterance | None] = []
            try:
                taken.append(inbox.get(timeout=timeout) if timeout != 0 else inbox.get_nowait())
                while True:
                    taken.append(inbox.get_nowait())
            except queue.Empty:
                pass
            if None in taken:
                for utt in taken:  # handed over with the close: they end as the rest of the inbox
                    if utt is not None:
                        inbox.put(utt)
                return None
            keep = self.cached.cache is not None
            lines = [utt for utt in taken if utt is not None]
            # Every line is a row before any request is built: a builder that raises fails them
            # all through the engine's failure path, none is lost between inbox and rows.
            for utt in lines:
                rows[utt.job.entry_id] = Row(utt, engine.sample_rate, max_slices=self.max_slices, keep=keep)
            return [(utt.job.entry_id, self.request(utt), utt.cancel) for utt in lines]

        def finish(row: Row) -> None:
            pcm = row.finish(self.meter)
            if pcm is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed: the worker is gone
                    loop.call_soon_threadsafe(self.cached.store, engine, row.utt, pcm)
            left()

        try:
            for key, item in engine.stream_continuous(admit):
                row = rows.get(key)
                if row is None:
                    continue
                if isinstance(item, list):  # word marks (base.RowItem)
                    row.mark(item)
                    continue
                if item is not None:
                    row.feed(item)
                    continue
                del rows[key]
                finish(row)
        except Exception as exc:  # the engine failed: its rows fail, the next job starts it again
            log.exception("context %s: engine %s failed", self.name, engine.name)
            reason = f"{type(exc).__name__}: {exc}"
            for row in rows.values():
                row.fail(reason)
                finish(row)
        else:
            reason = "context closed"
        finally:
            # Lines handed over but never admitted (the engine failed before asking for them, or
            # the context closed) end too: this thread is gone, and the next job starts a new one
            # with a new inbox. Unregistering first, under the lock ``admit`` puts under, means
            # no line can land in this inbox after the drain below.
            with self._lock:
                if self._served.get(engine.name) is inbox:
                    del self._served[engine.name]
            while True:
                try:
                    waiting = inbox.get_nowait()
                except queue.Empty:
                    break
                if waiting is None:
                    continue
                if waiting.claim("engine"):
                    waiting.error = reason
                    waiting.slices.close()
                left()
