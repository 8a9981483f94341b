"""The room clock: milliseconds since the Unix epoch, advanced by a monotonic clock.

Presentation times must agree across processes (several workers publish to one room, several
gateways serve it), so they are expressed in wall-clock time. But pacing must not jump when NTP
steps the wall clock, so a :class:`RoomClock` reads the wall clock once and then advances with
``time.monotonic``. Tests and benchmarks may inject their own.
"""

from __future__ import annotations

import asyncio
import math
import time


class RoomClock:
    def __init__(self) -> None:
        self._offset_ms = time.time() * 1000.0 - time.monotonic() * 1000.0
        self._ticks: dict[int, list[asyncio.Future[None]]] = {}
        """Tick number -> the sleepers waking on it (one timer per tick, see :meth:`sleep_until`)."""
        self._ticks_loop: asyncio.AbstractEventLoop | None = None

    def now_ms(self) -> float:
        return time.monotonic() * 1000.0 + self._offset_ms

    async def sleep_until(self, t_ms: float, *, tick_ms: float = 0.0) -> None:
        """Sleep until room-clock time ``t_ms`` (returns at once when it has passed).

        ``tick_ms`` > 0 rounds the wake-up up to the next multiple of ``tick_ms`` on the
        monotonic clock, so that everything due within one tick wakes in the same loop turn:
        a worker pacing 100 rooms then publishes their slices as one pipeline per tick
        (voxroom/store/autopipe.py) instead of 2,500 lone round trips a second. The sleepers of a tick
        share one timer: a timer each, set at different moments, fired a millisecond apart
        (the loop's timers have millisecond resolution) and split the tick's publishes."""
        delay = (t_ms - self.now_ms()) / 1000.0
        if delay <= 0:
            return
        if tick_ms <= 0:
            await asyncio.sleep(delay)
            return
        loop = asyncio.get_running_loop()
        if self._ticks_loop is not loop:  # a clock reused on another loop (tests) starts afresh
            self._ticks, self._ticks_loop = {}, loop
        tick_s = tick_ms / 1000.0
        tick = math.ceil((loop.time() + delay) / tick_s)
        sleepers = self._ticks.get(tick)
        if sleepers is None:
            sleepers = self._ticks[tick] = []
            loop.call_at(tick * tick_s, self._wake, tick)
        future: asyncio.Future[None] = loop.create_future()
        sleepers.append(future)  # one future each: a sleeper cancelled cancels only its own
        await future

    def _wake(self, tick: int) -> None:
        for future in self._ticks.pop(tick, ()):
            if not future.done():
                future.set_result(None)
