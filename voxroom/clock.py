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

    def now_ms(self) -> float:
        return time.monotonic() * 1000.0 + self._offset_ms

    async def sleep_until(self, t_ms: float, *, tick_ms: float = 0.0) -> None:
        """Sleep until room-clock time ``t_ms`` (returns at once when it has passed).

        ``tick_ms`` > 0 rounds the wake-up up to the next multiple of ``tick_ms`` on the
        monotonic clock, so that everything due within one tick wakes in the same loop turn:
        a worker pacing 100 rooms then publishes their slices as one pipeline per tick
        (voxroom/autopipe.py) instead of 2,500 lone round trips a second."""
        delay = (t_ms - self.now_ms()) / 1000.0
        if delay <= 0:
            return
        if tick_ms > 0:
            loop = asyncio.get_running_loop()
            tick_s = tick_ms / 1000.0
            wake = math.ceil((loop.time() + delay) / tick_s) * tick_s
            delay = wake - loop.time()
        await asyncio.sleep(delay)
