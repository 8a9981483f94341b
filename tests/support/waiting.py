"""Waiting in tests: one ``until()`` and one timeout factor.

Tests assert what arrived and in what order, never how fast; what they wait for they wait for
with a deadline, so a broken build fails instead of hanging. On a slower machine every deadline
stretches by one factor, ``VOXROOM_TEST_TIMEOUT_FACTOR`` (default 1; e.g. 3 under a debugger or on
an emulated CPU), applied to each test's own timeout (tests/conftest.py) and to every wait here
(websockets' test suite scales its timeouts the same way).
"""

from __future__ import annotations

import asyncio
import inspect
import os
import time
from collections.abc import Callable
from typing import Any

FACTOR = float(os.environ.get("VOXROOM_TEST_TIMEOUT_FACTOR", "1") or 1)


def scaled(seconds: float) -> float:
    """``seconds`` stretched by :data:`FACTOR`."""
    return seconds * FACTOR


async def until(done: Callable[[], Any], what: str | Callable[[], Any] = "the condition", *,
                timeout: float = 60.0, every: float = 0.05) -> Any:
    """Poll ``done()`` (a function, or a coroutine function) until it returns something true, and
    return that. Past ``timeout`` (scaled) raises ``AssertionError`` naming ``what`` (a string, or a
    function called for the message then: what was seen instead)."""
    deadline = time.monotonic() + scaled(timeout)
    while True:
        got = done()
        if inspect.isawaitable(got):
            got = await got
        if got:
            return got
        if time.monotonic() > deadline:
            message = what() if callable(what) else what
            if inspect.isawaitable(message):
                message = await message
            raise AssertionError(f"not within {scaled(timeout):.0f} s: {message}")
        await asyncio.sleep(every)
