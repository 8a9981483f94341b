"""Read a gateway's own figures in tests: the connection gauge on ``/metrics``, its RSS in /proc."""

from __future__ import annotations

import asyncio
import re
import time

import httpx

_CONNECTIONS = re.compile(r"^voxroom_connections(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


async def connections(port: int) -> int:
    """``voxroom_connections`` as the gateway's ``/metrics`` says it now."""
    async with httpx.AsyncClient(timeout=10) as http:
        resp = await http.get(f"http://127.0.0.1:{port}/metrics")
    resp.raise_for_status()
    found = _CONNECTIONS.search(resp.text)
    assert found is not None, resp.text[:2000]
    return int(float(found.group(1)))


async def wait_connections(port: int, expected: int, timeout: float = 30.0) -> int:
    """Poll the gauge until it reads ``expected`` (closes are noticed asynchronously); the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = await connections(port)
        if value == expected or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.2)


def _status_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise KeyError(field)


def rss_mib(pid: int) -> float:
    """Resident memory now (VmRSS)."""
    return _status_kib(pid, "VmRSS") / 1024


def peak_rss_mib(pid: int) -> float:
    """The most resident memory the process ever had (VmHWM): catches a spike a later read would miss."""
    return _status_kib(pid, "VmHWM") / 1024
