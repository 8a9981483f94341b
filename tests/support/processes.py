"""Start real voxroom processes for tests: ``voxroom gateway`` and ``voxroom worker``.

They run as separate OS processes on free ports against a real redis-server, exactly as an
operator would run them, so fault tests can SIGKILL them.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from tests.support.waiting import scaled
from voxroom.store.server import free_port

ROOT = Path(__file__).resolve().parents[2]


class Proc:
    def __init__(self, args: list[str], env: dict[str, str], log_path: Path, cwd: Path = ROOT) -> None:
        self.args = args
        self.log_path = log_path
        self._log = open(log_path, "ab")
        self.popen = subprocess.Popen(args, env=env, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)

    @property
    def pid(self) -> int:
        return self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL the process group, as a crash would."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait(10)

    def stop(self, timeout: float = 15.0) -> int | None:
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._log.close()
        return self.popen.returncode


def base_env(redis_url: str, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VOXROOM_")}
    env.update({"REDIS_URL": redis_url, "VOXROOM_LOG_LEVEL": "INFO", "PYTHONUNBUFFERED": "1"})
    env.update(extra)
    return env


def wait_http(url: str, timeout: float = 30.0, proc: Proc | None = None) -> None:
    timeout = scaled(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            raise RuntimeError(f"process died while starting:\n{proc.log_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=1) as resp:
                if resp.status < 500:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code < 500 or exc.code == 503:
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not answer within {timeout} s")


def start_gateway(redis_url: str, log_dir: Path, *, port: int | None = None, insecure: bool = True,
                  **env: str) -> tuple[Proc, int]:
    """A gateway process on ``port`` (a free one by default). ``insecure=False`` turns auth on:
    pass ``VOXROOM_JWT_SECRET`` in ``env``."""
    port = port or free_port()
    args = [sys.executable, "-m", "voxroom_cli", "gateway", "--port", str(port)]
    if insecure:
        args.append("--insecure-dev")
    proc = Proc(args, base_env(redis_url, **env), log_dir / f"gateway-{port}.log")
    with _stopped_if_not_ready(proc):
        wait_http(f"http://127.0.0.1:{port}/healthz", proc=proc)
    return proc, port


@contextlib.contextmanager
def _stopped_if_not_ready(proc: Proc) -> Iterator[None]:
    """A process that died or hung while starting is stopped and its log closed before the error
    goes up: left to the garbage collector, the open log file warned (ResourceWarning, an error
    here) in whatever test of that pytest process came later."""
    try:
        yield
    except BaseException:
        proc.stop()
        raise


def start_gateways(redis_url: str, log_dir: Path, procs: list[Proc], count: int = 2, **env: str) -> list[int]:
    """``count`` gateways on one Redis (as :func:`start_gateway`); their ports. Each process goes
    into ``procs`` as soon as it runs, so the caller that stops ``procs`` stops it even when a later
    one fails to start."""
    ports = []
    for _ in range(count):
        proc, port = start_gateway(redis_url, log_dir, **env)
        procs.append(proc)
        ports.append(port)
    return ports


def start_worker(redis_url: str, log_dir: Path, *, engine: str = "offline", contexts: int = 1,
                 name: str = "worker", **env: str) -> Proc:
    """A worker process, ready. Its ``/metrics`` listens on a free port unless ``env`` names one
    (``VOXROOM_WORKER_METRICS_PORT``; 0 turns it off): the heartbeat's ``metrics_port`` says which."""
    env.setdefault("VOXROOM_WORKER_METRICS_PORT", str(free_port()))
    proc = Proc([sys.executable, "-m", "voxroom_cli", "worker", "--engine", engine, "--contexts", str(contexts)],
                base_env(redis_url, **env), log_dir / f"{name}-{time.monotonic_ns()}.log")
    deadline = time.monotonic() + scaled(60)
    with _stopped_if_not_ready(proc):
        while "ready:" not in proc.log_text():
            if not proc.alive():
                raise RuntimeError(f"worker died while starting:\n{proc.log_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"worker not ready:\n{proc.log_text()[-3000:]}")
            time.sleep(0.05)
    return proc
