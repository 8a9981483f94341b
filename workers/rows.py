"""Continuous engines' rows: one serving thread per engine, lines handed to it through an inbox.

A continuous engine (``ContinuousEngine``) runs one long call, ``stream_continuous``, for as long
as its context lives; a new line joins the running batch at the engine's next step. The threads
and their inboxes are owned here and nowhere else: :meth:`ContinuousRows.admit` hands a line over
(starting the thread on first use), the thread ends its rows (``workers/rowaudio.py``) and, when
the engine fails or the context closes, every line handed to it. The next line starts a new one.
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

from workers.batching import batches
from workers.cached import CachedAudio
from workers.engines.base import ContinuousEngine, Engine, SynthesisRequest
from workers.job import Utterance
from workers.rowaudio import Meter, Row

log = logging.getLogger("voxroom.worker.context")

Inbox = queue.SimpleQueue[Utterance | None]
"""Lines for a serving thread; ``None`` tells it to stop."""


def continuous(engine: Engine) -> TypeGuard[ContinuousEngine]:
    """An engine that takes rows while it runs (``continuous`` set and ``max_batch`` > 1)."""
    return bool(getattr(engine, "continuous", False)) and batches(engine)


class ContinuousRows:
    """The serving threads of one context's continuous engines, by engine name.

    ``request`` builds a line's ``SynthesisRequest`` (the context's one builder); ``cached``
    receives each whole line's audio; ``meter`` counts the audio made.
    """

    def __init__(self, name: str, request: Callable[[Utterance], SynthesisRequest], cached: CachedAudio,
                 meter: Meter, *, max_slices: int) -> None:
        self.name = name
        self.request = request
        self.cached = cached
        self.meter = meter
        self.max_slices = max_slices
        self._served: dict[str, Inbox] = {}
        """Live serving threads' inboxes, by engine name. A thread removes its own entry (under
        ``_lock``) before it fails what is left in its inbox, and :meth:`admit` puts under the
        same lock: a line is either in a live thread's inbox or in the drain of a dying one,
        never in the inbox of a thread that is gone."""
        self._lock = threading.Lock()

    def admit(self, engine: ContinuousEngine, utt: Utterance) -> None:
        """Hand ``utt`` to the engine's serving thread (started on first use): it joins the
        running batch at the engine's next step. No await: the runner takes the next job at once."""
        with self._lock:
            inbox = self._served.get(engine.name)
            if inbox is None:
                inbox = queue.SimpleQueue()
                thread = threading.Thread(target=self._serve, args=(engine, inbox, asyncio.get_running_loop()),
                                          name=f"vx-{self.name}-{engine.name}", daemon=True)
                self._served[engine.name] = inbox
                thread.start()
            inbox.put(utt)
        # Let the engine's thread take the GIL now (sleep releases it): it starts this row's clock
        # at once instead of when the loop next blocks, after every other line of the burst. The
        # rows' first chunks then come as spread out as their lines arrived, and the loop
        # publishes each while the next is computed, instead of 100 in one clump (a burst of 100
        # rooms: 16 ms median added latency instead of 19, three alternating runs each).
        time.sleep(0)

    def close(self) -> None:
        """Tell every serving thread to stop once its engine asks for rows."""
        with self._lock:
            for inbox in self._served.values():
                inbox.put(None)

    def _serve(self, engine: ContinuousEngine, inbox: Inbox, loop: asyncio.AbstractEventLoop) -> None:
        """The engine's thread: one call to ``stream_continuous``, rows coming in through
        ``inbox``, each row fed and finished as a windowed batch's are."""
        rows: dict[Hashable, Row] = {}

        def admit(timeout: float | None) -> list[tuple[Hashable, SynthesisRequest, threading.Event]] | None:
            taken: list[Utterance | None] = []
            try:
                taken.append(inbox.get(timeout=timeout) if timeout != 0 else inbox.get_nowait())
                while True:
                    taken.append(inbox.get_nowait())
            except queue.Empty:
                pass
            admitted: list[tuple[Hashable, SynthesisRequest, threading.Event]] = []
            keep = self.cached.cache is not None
            for utt in taken:
                if utt is None:
                    return None
                key = utt.job.entry_id
                rows[key] = Row(utt, engine.sample_rate, max_slices=self.max_slices, keep=keep)
                admitted.append((key, self.request(utt), utt.cancel))
            return admitted

        def finish(row: Row) -> None:
            pcm = row.finish(self.meter)
            if pcm is not None:
                with contextlib.suppress(RuntimeError):  # the loop closed: the worker is gone
                    loop.call_soon_threadsafe(self.cached.store, engine, row.utt, pcm)

        try:
            for key, pcm in engine.stream_continuous(admit):
                row = rows.get(key)
                if row is None:
                    continue
                if pcm is not None:
                    row.feed(pcm)
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
                if waiting is not None and waiting.claim("engine"):
                    waiting.error = reason
                    waiting.slices.close()
