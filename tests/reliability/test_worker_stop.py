"""A worker stops on SIGTERM or SIGINT in every start-up state, within seconds (issue 28.10).

Before, a worker waiting for Redis at start retried through both signals (it ran 10 minutes under
``timeout 10``). Real ``voxroom worker`` processes: against a port where nothing listens, and against
a socket that accepts and never answers (the cluster probe blocks on it for its 5 s timeout, then the
consumer-group call waits for a reply that never comes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.support.processes import Proc, base_env
from voxroom.store.server import free_port

EXIT_WITHIN_S = 10.0
"""Generous for a shared CI machine; the worker takes well under 2 s here (see the report in the log)."""


@contextlib.contextmanager
def silent_redis() -> Iterator[int]:
    """A port that completes TCP handshakes (the kernel's backlog) and never answers a byte."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(64)
        yield listener.getsockname()[1]


def start(redis_port: int, logs: Path, metrics_port: int) -> Proc:
    return Proc([sys.executable, "-m", "voxroom_cli", "worker", "--engine", "offline", "--contexts", "1"],
                base_env(f"redis://127.0.0.1:{redis_port}/0", VOXROOM_WORKER_METRICS_PORT=str(metrics_port)),
                logs / f"worker-{time.monotonic_ns()}.log")


def wait_log(proc: Proc, text: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while text not in proc.log_text():
        assert proc.alive(), proc.log_text()[-2000:]
        assert time.monotonic() < deadline, f"{text!r} not logged:\n{proc.log_text()[-2000:]}"
        time.sleep(0.05)


def wait_connected(proc: Proc, port: int, timeout: float = 60.0) -> None:
    """Until the worker holds a TCP connection to ``port`` (its first call to Redis is under way)."""
    deadline = time.monotonic() + timeout
    while not any(c.raddr and c.raddr.port == port for c in psutil.Process(proc.pid).net_connections("tcp")):
        assert proc.alive(), proc.log_text()[-2000:]
        assert time.monotonic() < deadline, proc.log_text()[-2000:]
        time.sleep(0.05)


def wait_metrics(proc: Proc, port: int, timeout: float = 60.0) -> None:
    """The worker's /metrics answers from the moment ``run`` starts, before Redis is reached."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.alive(), proc.log_text()[-2000:]
        with contextlib.suppress(OSError):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=1):
                return
        assert time.monotonic() < deadline, proc.log_text()[-2000:]
        time.sleep(0.1)


def stop_with(proc: Proc, sig: signal.Signals) -> float:
    """Send ``sig`` to the worker alone (not its group, as `timeout` and Ctrl-C do); seconds to exit."""
    t0 = time.monotonic()
    os.kill(proc.pid, sig)
    try:
        code = proc.popen.wait(EXIT_WITHIN_S)
    except Exception:
        proc.kill()
        raise AssertionError(f"still running {EXIT_WITHIN_S} s after {sig.name}:\n{proc.log_text()[-2000:]}") from None
    elapsed = time.monotonic() - t0
    assert code == 0, f"exit status {code} after {sig.name}:\n{proc.log_text()[-2000:]}"
    return elapsed


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_retrying_a_dead_redis_stops_on_a_signal(tmp_path: Path, sig: signal.Signals) -> None:
    proc = start(free_port(), tmp_path, free_port())
    try:
        wait_log(proc, "redis unavailable at start")
        wait_log(proc, "retrying in 1.6 s")  # a few retries in: the backoff's wait is what held the stop
        elapsed = stop_with(proc, sig)
        assert "stopped before it was ready" in proc.log_text()
        print(f"{sig.name}: exited {elapsed:.2f} s after the signal")
    finally:
        proc.stop()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_worker_whose_redis_never_answers_stops_on_a_signal_in_each_start_up_state(
        tmp_path: Path, sig: signal.Signals) -> None:
    with silent_redis() as port:
        # 1. the cluster probe, blocked in its 5 s timeout (nothing is logged yet: send it at once)
        metrics = free_port()
        proc = start(port, tmp_path, metrics)
        try:
            wait_connected(proc, port)
            first = stop_with(proc, sig)
        finally:
            proc.stop()
        # 2. past the probe, the consumer-group call waiting for a reply (/metrics answers by then)
        proc = start(port, tmp_path, metrics)
        try:
            wait_metrics(proc, metrics)
            second = stop_with(proc, sig)
            assert "stopped before it was ready" in proc.log_text()
        finally:
            proc.stop()
    print(f"{sig.name}: exited {first:.2f} s (probing) and {second:.2f} s (waiting on XGROUP) after the signal")
