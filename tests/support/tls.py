"""Redis over TLS for the tests: certificates made with ``openssl`` (:class:`TlsFiles`, used by the
TLS cluster of tests/cluster/conftest.py too) and one ``redis-server`` that listens on a plain port
and a TLS port at once (:class:`TlsRedis`), so one test can compare what a client gets over each
from the same data.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from voxroom.store.server import find_redis_server, free_port


@dataclass(frozen=True)
class TlsFiles:
    """A CA and one certificate it signed (``127.0.0.1`` and ``localhost`` as subject names), made
    with ``openssl``: the servers' certificate, also their client certificate on the cluster
    bus and for replication, and the clients' (``tls-auth-clients`` is on by default)."""

    ca: Path
    cert: Path
    key: Path

    @classmethod
    def make(cls, folder: Path) -> TlsFiles:
        openssl = shutil.which("openssl")
        if openssl is None:
            raise RuntimeError("openssl is not on PATH")
        ca, ca_key = folder / "ca.crt", folder / "ca.key"
        cert, key, csr, ext = folder / "node.crt", folder / "node.key", folder / "node.csr", folder / "ext.cnf"
        ext.write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
        for args in (
                ["req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", ca_key, "-out", ca, "-days", "2",
                 "-subj", "/CN=voxroom-test-ca"],
                ["req", "-newkey", "rsa:2048", "-nodes", "-keyout", key, "-out", csr, "-subj", "/CN=127.0.0.1"],
                ["x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-out", cert,
                 "-days", "2", "-extfile", ext]):
            subprocess.run([openssl, *map(str, args)], capture_output=True, timeout=60, check=True)
        return cls(ca, cert, key)

    def url_query(self) -> str:
        """The ``ssl_*`` options of a ``rediss://`` URL (redis-py passes them to its connections)."""
        return f"ssl_ca_certs={self.ca}&ssl_certfile={self.cert}&ssl_keyfile={self.key}"

    def server_args(self) -> list[str]:
        return ["--tls-cert-file", str(self.cert), "--tls-key-file", str(self.key),
                "--tls-ca-cert-file", str(self.ca)]


@dataclass
class TlsRedis:
    """One ``redis-server`` in ``data_dir`` (RDB ``dump.rdb`` there, no automatic saves) on a
    plain port and a TLS port. ``extra`` arguments are added at each :meth:`start`."""

    data_dir: Path
    tls: TlsFiles
    port: int = field(default_factory=free_port)
    tls_port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    def __post_init__(self) -> None:
        # Two free ports asked for one after the other can be the same one (the first was released
        # before the second was asked for): redis-server then exits, unable to bind it twice.
        while self.tls_port == self.port:
            self.tls_port = free_port()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def tls_url(self) -> str:
        return f"rediss://127.0.0.1:{self.tls_port}/0?{self.tls.url_query()}"

    def start(self, *extra: str, loaded: bool = True, timeout_s: float = 15.0) -> TlsRedis:
        """Started and answering on its plain port: ``+PONG``, or with ``loaded=False`` a
        ``-LOADING`` reply too (a server still loading its RDB)."""
        args = [find_redis_server(), "--port", str(self.port), "--tls-port", str(self.tls_port),
                "--bind", "127.0.0.1", "--dir", str(self.data_dir), "--dbfilename", "dump.rdb", "--save", "",
                "--appendonly", "no", "--protected-mode", "no", *self.tls.server_args(), *extra]
        self.process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                        start_new_session=True)
        ready = (b"+PONG",) if loaded else (b"+PONG", b"-LOADING")
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}: {args}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), 0.2) as s:
                s.sendall(b"PING\r\n")
                if s.recv(64).startswith(ready):
                    return self
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"redis-server did not answer on port {self.port} within {timeout_s} s")

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
