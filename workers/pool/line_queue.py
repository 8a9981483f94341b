"""A context's queue of jobs not yet started, fair across rooms (see ``workers/pool/context.py`` for
the context's other bounds).

Before, it was one FIFO: a room that queued 16 lines made every room behind it wait for all 16
syntheses (13.7 s to another room's first audio, issue 14). Now each room has a FIFO of its own
and the runner takes, of the rooms that run out of audio soonest, the next one in turn:

- **Rooms in turn, the fewest lines taken first.** Each room carries a turn number, its next
  line's start tag in start-time fair queuing with one line as the unit: a room that begins to
  queue starts at the clock (the highest turn taken so far), or at its own next turn if a line of
  it was taken since the clock passed that; each line taken moves its room's turn on by one. The
  runner takes the lowest, and among equals the room first in the rotation (a room whose line
  was taken goes to the back). So a room that arrives while another room's backlog runs waits
  for at most the one line of it already taken, however the two rooms' lines were read into the
  queue. Before, the flooding room went back in the rotation *ahead* of rooms that came after its
  first line (the worker reads a flood a few lines at a time), and its second line came before
  them once its audio ran low: two flood lines at the worst (issue 14).
- **Playout deadline first.** ``buffered_ms(room)`` says how much audio of the room this worker
  holds and has not yet published (the context's pool sums it over the room's lines in
  synthesis or waiting to publish). A room with less than :data:`URGENT_MS` buffered (nothing
  playing, or its last line nearly done) goes before a room whose audio still plays for seconds,
  which can wait: its next line cannot play before the current one ends anyway. Among the rooms
  about to run out, the turn numbers decide: a room that has had more lines waits, so a flood
  whose audio runs low may leave a short gap while rooms wait for their first line, rather than
  make them wait for a second line of it.
- **A room's lines in order.** Within a room, lines are taken in ``seq`` order.

Bounds: ``maxsize`` counts *ready* lines (each room's first queued line, plus a line put back);
``backlog`` counts the later lines held behind them. Reading a room's backlog is what lets the
context see the other rooms' lines behind a flood in the ``vx:jobs`` stream: with only
``maxsize`` (4) lines of look-ahead, the queue held nothing but the flooding room's lines. Past
either bound the worker stops reading (:meth:`room`); the jobs stay in Redis (back-pressure).
Adopted jobs (:meth:`put_first`) go ahead of everything, whatever the bounds.

**Lines an engine cannot take yet.** The runner passes :meth:`get` an ``accept`` test: a line
whose engine has no free place (a continuous engine holding ``max_batch`` plus its spare lines,
``workers/pool/continuous_rows.py``) is passed over, and its room keeps its turn, so the next free place goes to
whichever line this queue's order puts first at that moment (an adopted line first: it waits for
a place of its engine like any line, since a place frees when a row ends, not when a line is
published, and no line in an engine waits on another to end). :meth:`wake` says a place opened.

``fair=False`` keeps the old first-come-first-served queue (one FIFO bounded at ``maxsize``, no
backlog) for benchmarks that compare the two (``VOXROOM_CONTEXT_FAIR=0``).
"""

from __future__ import annotations

import asyncio
import bisect
from collections import OrderedDict, deque
from collections.abc import Callable

from workers.utterance import Utterance

Accept = Callable[[Utterance], bool]
"""Whether a line may be taken now (its engine has a free place)."""

URGENT_MS = 1000.0
"""A room with less audio than this buffered is about to run out: such rooms are equally
urgent (served in turn); a room with more waits behind them, the most buffered last."""


AFTER_MAX = 4096
"""Most rooms whose next turn is kept after their queue here emptied (see ``JobQueue._after``).
The clock moves on whenever a room's later line is taken, and drops every turn it reaches, so
this only bounds a queue that sees thousands of rooms say one line each and no second; a room
forgotten starts level with the rest."""


def _nothing_buffered(room: str) -> float:
    del room
    return 0.0


class JobQueue:
    """One consumer, the context's runner; one producer, the worker's intake (through the pool)."""

    def __init__(self, maxsize: int, backlog: int = 64, *, fair: bool = True) -> None:
        self.maxsize = maxsize
        self.backlog = backlog if fair else 0
        self.fair = fair
        self.buffered_ms: Callable[[str], float] = _nothing_buffered
        """Audio of a room not yet published (ms); the pool sets it (``ContextPool``)."""
        self._first: deque[Utterance] = deque()
        self._back: deque[Utterance] = deque()
        """Jobs put back (:meth:`put_back`): next, in the order they were taken."""
        self._rooms: OrderedDict[str, deque[Utterance]] = OrderedDict()
        """Each room's queued lines in ``seq`` order; the dict's order is the rotation. In FIFO
        mode one deque under the key ``""`` holds every job."""
        self._turns: dict[str, int] = {}
        """Each queued room's turn number (fair mode): its next line's start tag in lines."""
        self._clock = 0
        """The highest turn number taken so far: where a room that begins to queue starts."""
        self._after: dict[str, int] = {}
        """The next turn of rooms whose queue here emptied, kept while it is ahead of the clock:
        a room whose next line is read after its last one was taken (a flood read a line at a
        time) goes on from its own turn, not level with rooms that have had nothing."""
        self._size = 0
        self._ready = asyncio.Event()

    def qsize(self) -> int:
        return len(self._first) + len(self._back) + self._size

    def empty(self) -> bool:
        return self.qsize() == 0

    def ready(self) -> int:
        """Lines that count against ``maxsize``."""
        return len(self._back) + (len(self._rooms) if self.fair else self._size)

    def held(self) -> int:
        """Later lines held behind their room's first (they count against ``backlog``)."""
        return self._size - len(self._rooms) if self.fair else 0

    def room(self) -> int:
        """How many more jobs, of any rooms, may be read for this queue: each fits, whether it
        turns out to be a room's first line here or a later one."""
        if not self.fair:
            return max(0, self.maxsize - self._size)
        return max(0, min(self.maxsize - self.ready(), self.backlog - self.held()))

    def holds(self, room: str) -> bool:
        """Lines of ``room`` are queued here (a later line of it belongs behind them)."""
        return self.fair and room in self._rooms

    def fits(self, utt: Utterance) -> bool:
        if not self.fair:
            return self._size < self.maxsize
        if utt.job.room in self._rooms:
            return self.held() < self.backlog
        return self.ready() < self.maxsize

    def put_nowait(self, utt: Utterance) -> None:
        """Raises ``asyncio.QueueFull`` when it does not fit (:meth:`fits`)."""
        if not self.fits(utt):
            raise asyncio.QueueFull
        name = utt.job.room if self.fair else ""
        lines = self._rooms.get(name)
        if lines is None:
            lines = self._rooms[name] = deque()
            # A room that begins to queue starts level with the line taken last (or later, if
            # it had lines since): ahead of a room that has had more, behind none before it.
            self._turns[name] = max(self._clock, self._after.pop(name, 0))
        if not lines or not self.fair or lines[-1].job.seq <= utt.job.seq:
            lines.append(utt)
        else:  # out of order (a later line read first): still taken in seq order
            bisect.insort(lines, utt, key=lambda u: u.job.seq)
        self._size += 1
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
        (self._first if utt.adopted else self._back).appendleft(utt)
        self._ready.set()

    def get_nowait(self, accept: Accept | None = None) -> Utterance:
        """The next line (adopted, then put back, then by room), of those ``accept`` takes;
        raises ``asyncio.QueueEmpty`` when there is none."""
        utt = self._take(accept)
        if utt is None:
            raise asyncio.QueueEmpty
        return utt

    def _take(self, accept: Accept | None) -> Utterance | None:
        for held in (self._first, self._back):
            for i, utt in enumerate(held):
                if accept is None or accept(utt):
                    del held[i]
                    return utt
        name = self._next_room(accept)
        if name is None:
            return None
        lines = self._rooms[name]
        utt = lines.popleft()
        self._size -= 1
        turn = self._turns[name]
        if turn > self._clock:
            self._clock = turn
            # Turns the clock has reached say nothing any more (a room starts there anyway).
            self._after = {room: after for room, after in self._after.items() if after > turn}
        if lines:
            self._turns[name] = turn + 1
            self._rooms.move_to_end(name)  # its turn is over: to the back of the rotation
        else:
            del self._rooms[name]
            del self._turns[name]
            self._after[name] = turn + 1
            if len(self._after) > AFTER_MAX:  # bounded: the oldest is forgotten (starts level)
                del self._after[next(iter(self._after))]
        return utt

    def _next_room(self, accept: Accept | None = None) -> str | None:
        """Of the rooms whose next line ``accept`` takes (a room passed over keeps its place),
        the one that runs out of audio soonest (under :data:`URGENT_MS` counts as now), then the
        lowest turn number, then the first in the rotation. Stops at the first room that
        nothing can beat (every room of a burst: they all start level), else looks at every
        queued room, at most ``maxsize`` (each a few dict lookups). ``None``: no room has a line
        that may be taken."""
        best: str | None = None
        best_key = (float("inf"), 0)
        lowest = min(self._turns.values(), default=0)
        for name, lines in self._rooms.items():
            if accept is not None and not accept(lines[0]):
                if not self.fair:
                    return None  # first come first served: the head waits, and so does the rest
                continue
            if not self.fair:
                return name
            buffered = self.buffered_ms(name)
            key = (0.0 if buffered < URGENT_MS else buffered, self._turns[name])
            if key < best_key:
                best, best_key = name, key
                if key == (0.0, lowest):
                    break
        return best

    def wake(self) -> None:
        """A line passed over by ``accept`` may be taken now (its engine freed a place)."""
        self._ready.set()

    async def get(self, accept: Accept | None = None) -> Utterance:
        """Wait for a line ``accept`` takes (any line without it)."""
        while (utt := self._take(accept)) is None:
            self._ready.clear()
            await self._ready.wait()
        return utt
