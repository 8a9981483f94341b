"""A context's queue of jobs not yet started (see ``workers/context.py`` for its bounds)."""

from __future__ import annotations

import asyncio
from collections import deque

from workers.job import Utterance


class JobQueue:
    """A context's queue of jobs not yet started: bounded at ``maxsize`` for what the worker
    reads, with a first lane for adopted jobs (:meth:`Context.adopt`) that passes the bound.
    One consumer, the context's runner."""

    def __init__(self, maxsize: int) -> None:
        self.maxsize = maxsize
        self._first: deque[Utterance] = deque()
        self._items: deque[Utterance] = deque()
        self._ready = asyncio.Event()

    def qsize(self) -> int:
        return len(self._first) + len(self._items)

    def empty(self) -> bool:
        return not self._first and not self._items

    def put_nowait(self, utt: Utterance) -> None:
        """Raises ``asyncio.QueueFull`` past ``maxsize``."""
        if self.qsize() >= self.maxsize:
            raise asyncio.QueueFull
        self._items.append(utt)
        self._ready.set()

    async def put(self, utt: Utterance) -> None:
        """As :meth:`put_nowait` (callers never wait here: they read only what fits)."""
        self.put_nowait(utt)

    def put_first(self, utt: Utterance) -> None:
        """Ahead of every ordinary job (after earlier adopted ones), whatever the bound."""
        self._first.append(utt)
        self._ready.set()

    def put_back(self, utt: Utterance) -> None:
        """Return a job just taken (it goes first again)."""
        (self._first if utt.adopted else self._items).appendleft(utt)
        self._ready.set()

    def get_nowait(self) -> Utterance:
        if self._first:
            return self._first.popleft()
        if self._items:
            return self._items.popleft()
        raise asyncio.QueueEmpty

    async def get(self) -> Utterance:
        while self.empty():
            self._ready.clear()
            await self._ready.wait()
        return self.get_nowait()
