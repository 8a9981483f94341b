"""Paced sleepers due within one tick share one timer and wake in the same loop turn
(workers/output/clock.py): a worker's paced publishes of that tick then leave as one script and wake a
gateway's reader once (docs/benchmarks.md). No timing asserted beyond "not before it is due"."""

from __future__ import annotations

import asyncio
import math

import pytest
import uvloop

from workers.output.clock import RoomClock

# The machine's own timing is what these measure (a row starts on its own clock, a tick wakes its
# sleepers together): run alone (scripts/test), not beside tests that keep the cores busy.
pytestmark = pytest.mark.serial

TICK_MS = 10.0


class TurnCounter:
    """Counts event-loop turns: a callback that schedules itself once per turn."""

    def __init__(self) -> None:
        self.turn = 0
        self._loop = asyncio.get_running_loop()
        self._handle = self._loop.call_soon(self._step)

    def _step(self) -> None:
        self.turn += 1
        self._handle = self._loop.call_soon(self._step)

    def stop(self) -> None:
        self._handle.cancel()


async def _one_tick_of_sleepers() -> list[tuple[float, int]]:
    clock = RoomClock()
    counter = TurnCounter()
    woke: list[tuple[float, int]] = []

    async def sleeper(due_ms: float) -> None:
        await clock.sleep_until(due_ms, tick_ms=TICK_MS)
        woke.append((due_ms, counter.turn))
        assert clock.now_ms() >= due_ms - 1.0, "woken before it was due"  # the loop's clock rounds to 1 ms

    try:
        # Tasks started in different loop turns, due at different moments within a fraction of a
        # millisecond of each other, as rooms' slices are.
        # Due well after the last is started (50 ticks), so that one preemption while they are
        # being started cannot make some of them due already.
        base = clock.now_ms() + 50 * TICK_MS
        tasks = []
        for i in range(20):
            tasks.append(asyncio.create_task(sleeper(base + (i % 4) * 0.2)))
            await asyncio.sleep(0.0003)
        await asyncio.gather(*tasks)
    finally:
        counter.stop()
    return woke


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_sleepers_of_one_tick_wake_in_one_loop_turn_and_not_early(loop_kind: str) -> None:
    # uvloop, as the worker runs: its timers have millisecond resolution, so a timer per sleeper
    # fired the sleepers of one tick in two or three loop turns.
    loop = uvloop.new_event_loop() if loop_kind == "uvloop" else asyncio.new_event_loop()
    try:
        woke = loop.run_until_complete(_one_tick_of_sleepers())
    finally:
        loop.close()
    assert len(woke) == 20
    # Due within 0.6 ms: one tick, or two when a tick boundary falls among them.
    due_ticks = {math.ceil(due / TICK_MS) for due, _ in woke}
    assert len({turn for _, turn in woke}) <= min(2, len(due_ticks) + 1), woke


async def test_a_cancelled_sleeper_does_not_wake_or_cancel_the_others() -> None:
    clock = RoomClock()
    due = clock.now_ms() + 2 * TICK_MS
    a = asyncio.create_task(clock.sleep_until(due, tick_ms=TICK_MS))
    b = asyncio.create_task(clock.sleep_until(due, tick_ms=TICK_MS))
    await asyncio.sleep(0)
    a.cancel()
    await asyncio.gather(a, return_exceptions=True)
    await asyncio.wait_for(b, 5)
    assert a.cancelled() and b.done() and not b.cancelled()
    assert clock._ticks == {}, "nothing left behind once the tick fired"


async def test_past_or_unticked_sleeps_behave_as_before() -> None:
    clock = RoomClock()
    await clock.sleep_until(clock.now_ms() - 5, tick_ms=TICK_MS)  # already due: returns at once
    due = clock.now_ms() + 5
    await clock.sleep_until(due)
    assert clock.now_ms() >= due - 1.0
