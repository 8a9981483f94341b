"""One owner for every background loop of a process: it restarts what died and says what is down.

A loop here is a coroutine meant to run for the life of the process (a hub reader, the worker's
intake, the heartbeat, the cache writer). Before, each was a bare task whose death was one log
line: the process went on saying it was ready with a room reader or its heartbeat gone. Now::

    supervisor = Supervisor("gateway")
    supervisor.spawn("hub:reader:0", reader.run)     # a factory: called again on every restart
    ...
    supervisor.down()      # ["hub:reader:0"] while it is between a crash and its restart
    await supervisor.aclose()

A loop that raises is logged once with its traceback, marked down, and started again after a
capped exponential backoff (0.1 s doubling to 5 s; back to 0.1 s once it has run for
:data:`HEALTHY_AFTER_S` without failing). A loop that returns normally is finished and not
restarted (a loop that must never end should never return). Cancellation is the owner's
decision (:meth:`stop`, :meth:`aclose`), never a failure.

``/readyz`` (gateway) and the worker's heartbeat read :meth:`snapshot`; ``/metrics`` exports
:data:`voxroom.runtime.metrics.LOOP_UP` and ``LOOP_RESTARTS`` per loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from typing import Any

from voxroom.runtime import metrics

log = logging.getLogger("voxroom.runtime.supervisor")

LoopFactory = Callable[[], Coroutine[Any, Any, None]]

HEALTHY_AFTER_S = 30.0
"""A loop that ran this long since its last restart starts the next backoff from the beginning."""


@dataclass(slots=True)
class LoopState:
    name: str
    up: bool = True
    restarts: int = 0
    last_error: str | None = None
    started_at: float = 0.0
    finished: bool = False


class Supervisor:
    def __init__(self, process: str, *, first_backoff_s: float = 0.1, max_backoff_s: float = 5.0) -> None:
        self.process = process
        self.first_backoff_s = first_backoff_s
        self.max_backoff_s = max_backoff_s
        self._loops: dict[str, LoopState] = {}
        self._tasks: dict[str, asyncio.Task[None]] = {}

    def spawn(self, name: str, factory: LoopFactory) -> asyncio.Task[None]:
        """Run ``factory()`` as loop ``name`` (unique within this supervisor), restarting it when
        it raises. Returns the owning task (cancel it through :meth:`stop`)."""
        if name in self._tasks and not self._tasks[name].done():
            raise ValueError(f"loop {name!r} is already running")
        state = LoopState(name)
        self._loops[name] = state
        metrics.LOOP_UP.labels(self.process, name).set(1)
        task = asyncio.create_task(self._keep(state, factory), name=name)
        self._tasks[name] = task
        return task

    async def _keep(self, state: LoopState, factory: LoopFactory) -> None:
        # Failures in a row: the backoff doubles with each, from the supervisor's current first
        # delay (read at each failure, so an owner may lengthen it while the loop runs).
        failures = 0
        while True:
            state.started_at = time.monotonic()
            state.up = True
            metrics.LOOP_UP.labels(self.process, state.name).set(1)
            try:
                await factory()
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                if time.monotonic() - state.started_at >= HEALTHY_AFTER_S:
                    failures = 0
                delay = min(self.first_backoff_s * 2 ** failures, self.max_backoff_s)
                failures += 1
                state.up = False
                state.restarts += 1
                state.last_error = f"{type(exc).__name__}: {exc}"[:300]
                metrics.LOOP_UP.labels(self.process, state.name).set(0)
                metrics.LOOP_RESTARTS.labels(self.process, state.name).inc()
                log.error("%s loop %s failed (restart %d in %.1f s)", self.process, state.name, state.restarts,
                          delay, exc_info=exc)
                await asyncio.sleep(delay)
                continue
            state.finished = True
            log.info("%s loop %s finished", self.process, state.name)
            return

    def down(self) -> list[str]:
        """Loops between a failure and their restart."""
        return sorted(name for name, state in self._loops.items() if not state.up)

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """Per loop: up, restarts, last error (for ``/readyz`` and heartbeats)."""
        return {name: {"up": s.up, "restarts": s.restarts, "last_error": s.last_error}
                for name, s in sorted(self._loops.items())}

    def restarts(self) -> int:
        return sum(s.restarts for s in self._loops.values())

    async def stop(self, name: str) -> None:
        """Cancel loop ``name`` on purpose (a room reader whose rooms all left) and forget it."""
        task = self._tasks.pop(name, None)
        self._loops.pop(name, None)
        with contextlib.suppress(KeyError):  # a name that never ran has no series
            metrics.LOOP_UP.remove(self.process, name)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    async def aclose(self) -> None:
        """Cancel every loop and wait for them (shutdown)."""
        tasks = list(self._tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
