"""A continuous synthetic engine that runs at most ``max_batch`` rows and queues the rest first in,
first out, as ChatTTS's ``ContinuousBatcher`` does (the plain synthetic engine runs every row it is
given at once, so no line of it ever waits inside the engine). It notes what happened to each
line, in order, from its own thread: ``handed`` (the context gave it the line), ``joined`` (a row
took it), ``first`` (its first chunk), ``done`` (it left: end, cancel or cut)."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Hashable, Iterator

from workers.engines.base import Admit, Pcm, SynthesisRequest
from workers.engines.synthetic import SyntheticEngine, _Row

POLL_S = 0.05
"""A running engine looks at its rows' cancels at least this often (ChatTTS: every GPT step)."""


class FifoEngine(SyntheticEngine):
    def __init__(self, *, ttfc_ms: float, rtf: float, max_batch: int) -> None:
        super().__init__(ttfc_ms=ttfc_ms, rtf=rtf, max_batch=max_batch, continuous=True)
        self.events: list[tuple[str, str]] = []
        """``(what, "room/seq")`` in the order they happened."""
        self.most_held = 0
        """The most lines handed and not done at once."""
        self._held = 0
        self._lock = threading.Lock()

    def note(self, what: str, line: str) -> None:
        with self._lock:
            self.events.append((what, line))
            self._held += {"handed": 1, "done": -1}.get(what, 0)
            self.most_held = max(self.most_held, self._held)

    def index(self, what: str, line: str) -> int:
        """Where ``(what, line)`` is in :attr:`events` (``ValueError`` when it never happened)."""
        with self._lock:
            return self.events.index((what, line))

    def happened(self, what: str, line: str) -> bool:
        with self._lock:
            return (what, line) in self.events

    def stream_continuous(self, admit: Admit) -> Iterator[tuple[Hashable, Pcm | None]]:
        rows: dict[Hashable, _Row] = {}
        names: dict[Hashable, str] = {}
        waiting: deque[tuple[Hashable, SynthesisRequest, threading.Event]] = deque()
        while True:
            due = min((row.due for row in rows.values()), default=None)
            wait = None if due is None else max(0.0, due - time.monotonic())
            if waiting and len(rows) < self.max_batch:
                wait = 0.0  # rows left last turn: the waiting lines join now
            elif rows or waiting:
                wait = min(POLL_S, wait if wait is not None else POLL_S)  # a cancel is seen within a poll
            admitted = admit(wait)
            if admitted is None:
                return
            for key, request, cancel in admitted:
                names[key] = request.request_id
                self.note("handed", request.request_id)
                waiting.append((key, request, cancel))
            for item in [w for w in waiting if w[2].is_set()]:
                waiting.remove(item)
                self.note("done", names[item[0]])
                yield item[0], None
            for key, row in list(rows.items()):
                if row.cancel.is_set():
                    del rows[key]
                    self.note("done", names[key])
                    yield key, None
            while waiting and len(rows) < self.max_batch:
                key, request, cancel = waiting.popleft()
                rows[key] = _Row(self._audio(request.text), 0, time.monotonic() + self.ttfc_s, cancel)
                self.note("joined", names[key])
            now = time.monotonic()
            for key, row in list(rows.items()):
                if row.due > now:
                    continue
                chunk = row.audio[row.pos:row.pos + self.chunk_samples]
                if row.pos == 0:
                    self.note("first", names[key])
                row.pos += chunk.size
                yield key, chunk
                if row.pos >= row.audio.size or row.cancel.is_set():  # its end, or cut on this chunk
                    del rows[key]
                    self.note("done", names[key])
                    yield key, None
                else:
                    row.due += chunk.size / self.sample_rate * self.rtf
