"""A stop asked for while a worker starts: it ends every start-up state at once.

A worker waiting for Redis at start went on retrying through SIGINT and SIGTERM (it ran 10 minutes
under ``timeout 10``): the signal only set the event the serving loop waits on, and start-up never
looked at it. Start-up here races the stop: waiting for Redis, asking it whether it is a cluster,
loading engines. What a stop cannot cut short is a blocking call already running on a thread (a
Redis probe with its 5 s timeout, ChatTTS loading its weights for minutes); such a call runs on a
daemon thread, or the process leaves without joining the thread that runs it (:func:`leave_now`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

log = logging.getLogger("voxroom.worker")

T = TypeVar("T")
CONTEXT_THREAD_PREFIX = "vx-"
"""workers/pool/context.py names its one thread ``vx-{context}``: engine loads and synthesis run there."""


async def unless_stopped(work: Awaitable[T], stopping: asyncio.Event) -> tuple[bool, T | None]:
    """``(True, result)`` when ``work`` finishes first; ``(False, None)`` as soon as ``stopping`` is
    set, with ``work`` cancelled (and awaited: its cleanup ran). An exception of ``work`` is raised."""
    task = asyncio.ensure_future(work)
    stop = asyncio.create_task(stopping.wait(), name="worker:stop-watch")
    try:
        await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if task.cancelled():
        return False, None
    return True, task.result()


def in_daemon_thread(fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
    """``fn(*args)`` on a daemon thread, as a future of the running loop: for a blocking call that a
    stop must be able to walk away from (a default-executor thread is joined before the process exits)."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()

    def settle(result: T | None, exc: BaseException | None) -> None:
        if future.done():
            return  # the caller stopped waiting
        if exc is not None:
            future.set_exception(exc)
        else:
            future.set_result(result)  # type: ignore[arg-type]

    def run() -> None:
        try:
            result = fn(*args)
        except BaseException as exc:  # handed to the awaiting coroutine, raised there
            loop.call_soon_threadsafe(settle, None, exc)
        else:
            loop.call_soon_threadsafe(settle, result, None)

    threading.Thread(target=run, name=f"vx-probe:{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future


def leave_now(code: int) -> None:
    """After the worker stopped: when a context thread is still busy (an engine still loading), exit
    at once with ``code`` instead of joining it at interpreter exit (which waits for the load).
    Logs are flushed first; nothing else is left to do (jobs were handed back or never taken)."""
    busy = [t.name for t in threading.enumerate()
            if t.name.startswith(CONTEXT_THREAD_PREFIX) and t.is_alive() and not t.daemon]
    if not busy:
        return
    log.info("leaving without waiting for %s (still busy: an engine loading)", ", ".join(sorted(busy)))
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
