"""voxroom/runtime/supervisor.py: a loop that dies is restarted, and is reported down until it is."""

from __future__ import annotations

import asyncio

from voxroom.runtime.supervisor import Supervisor


async def test_a_failing_loop_is_reported_down_then_restarted() -> None:
    supervisor = Supervisor("test", first_backoff_s=0.2, max_backoff_s=0.4)
    runs: list[int] = []
    release = asyncio.Event()

    async def flaky() -> None:
        runs.append(len(runs))
        if len(runs) <= 2:
            raise RuntimeError(f"boom {len(runs)}")
        await release.wait()  # the third run lives until told otherwise

    supervisor.spawn("flaky", flaky)
    await asyncio.sleep(0.05)
    assert supervisor.down() == ["flaky"], "down between the failure and its restart"
    snap = supervisor.snapshot()["flaky"]
    assert snap["up"] is False and snap["restarts"] == 1 and snap["last_error"] == "RuntimeError: boom 1"
    for _ in range(100):
        if len(runs) == 3:
            break
        await asyncio.sleep(0.05)
    assert len(runs) == 3
    assert supervisor.down() == []
    assert supervisor.snapshot()["flaky"]["restarts"] == 2
    release.set()
    await supervisor.aclose()


async def test_a_loop_that_returns_is_finished_and_cancel_is_not_a_failure() -> None:
    supervisor = Supervisor("test")
    calls = 0

    async def once() -> None:
        nonlocal calls
        calls += 1

    async def forever() -> None:
        await asyncio.Event().wait()

    supervisor.spawn("once", once)
    supervisor.spawn("forever", forever)
    await asyncio.sleep(0.05)
    assert calls == 1 and supervisor.down() == []
    await supervisor.stop("forever")
    assert "forever" not in supervisor.snapshot()
    await supervisor.aclose()
    assert supervisor.restarts() == 0
