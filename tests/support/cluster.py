"""A real Redis Cluster for tests and benchmarks: 3 primaries and 3 replicas of ``redis-server
--cluster-enabled yes`` on free ports, joined with ``redis-cli --cluster create``, as an operator
would build one (and the same over TLS). No skip: a ``redis-server`` without cluster support (or a
missing ``redis-cli``) fails what uses it, it does not hide it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests.support.tls import TlsFiles
from voxroom.store.redis_config import SERVER_ARGS
from voxroom.store.server import find_redis_server, free_port

PRIMARIES = 3
START_TIMEOUT_S = 30.0


@dataclass
class ClusterNode:
    port: int
    bus_port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        """A plain (non-cluster) connection to this one node: it answers for its own slots only."""
        return redis.Redis(port=self.port, socket_timeout=5)


@dataclass
class RedisClusterProcs:
    """Six ``redis-server`` processes in cluster mode, in ``data_dir``. ``start()`` returns when
    every node says ``cluster_state:ok`` and knows all six."""

    data_dir: Path
    executable: str = field(default_factory=find_redis_server)
    nodes: list[ClusterNode] = field(default_factory=list)

    @property
    def url(self) -> str:
        """``REDIS_URL`` naming one node: all a client is given."""
        return self.nodes[0].url

    def primaries(self) -> list[ClusterNode]:
        return [n for n in self.nodes if n.client().info("replication")["role"] == "master"]

    def start(self) -> RedisClusterProcs:
        cli = shutil.which("redis-cli")
        if cli is None:
            raise RuntimeError("redis-cli is not on PATH: install Debian's redis-tools (scripts/system-deps)")
        for _ in range(2 * PRIMARIES):
            port, bus = free_port(), free_port()
            # cluster-port: the bus port would be port + 10000 otherwise, which nobody checked is free.
            args = [self.executable, *self._port_args(port), "--cluster-port", str(bus), "--bind", "127.0.0.1",
                    "--cluster-enabled", "yes", "--cluster-config-file", f"nodes-{port}.conf",
                    "--cluster-node-timeout", "5000", "--cluster-require-full-coverage", "no",
                    "--dir", str(self.data_dir), "--save", "", *SERVER_ARGS,
                    "--appendonly", "no", "--protected-mode", "no"]
            # The server's own log: to a file, never a pipe nobody reads (it would fill and block it).
            args += ["--logfile", str(self.data_dir / f"redis-{port}.log")]
            proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
            self.nodes.append(self._node(port, bus, proc))
        deadline = time.monotonic() + START_TIMEOUT_S
        for node in self.nodes:
            self._wait_ping(node, deadline)
        create = subprocess.run(
            [cli, *self._cli_args(), "--cluster", "create", *[f"127.0.0.1:{n.port}" for n in self.nodes],
             "--cluster-replicas", "1", "--cluster-yes"],
            capture_output=True, text=True, timeout=START_TIMEOUT_S, check=False)
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed:\n{create.stdout}\n{create.stderr}")
        while not all(self._ready(n) for n in self.nodes):
            if time.monotonic() > deadline:
                raise TimeoutError(f"cluster not ok within {START_TIMEOUT_S} s:\n{create.stdout}")
            time.sleep(0.1)
        return self

    # Hooks for a TLS cluster (TlsRedisClusterProcs below): a plain one as before.
    def _port_args(self, port: int) -> list[str]:
        return ["--port", str(port)]

    def _node(self, port: int, bus: int, proc: subprocess.Popen[bytes]) -> ClusterNode:
        return ClusterNode(port, bus, proc)

    def _cli_args(self) -> list[str]:
        return []

    def _wait_ping(self, node: ClusterNode, deadline: float) -> None:
        while True:
            if node.process.poll() is not None:
                log = self.data_dir / f"redis-{node.port}.log"
                out = log.read_text(errors="replace") if log.exists() else ""
                raise RuntimeError(f"redis-server --cluster-enabled yes exited with {node.process.returncode} "
                                   f"({self.executable}):\n{out[-2000:]}")
            with contextlib.suppress(redis.ConnectionError), node.client() as r:
                if r.ping():
                    return
            if time.monotonic() > deadline:
                raise TimeoutError(f"redis-server on port {node.port} did not answer")
            time.sleep(0.05)

    @staticmethod
    def _ready(node: ClusterNode) -> bool:
        with node.client() as r:
            info = r.execute_command("CLUSTER", "INFO").decode()
        fields = dict(line.split(":", 1) for line in info.split() if ":" in line)
        return (fields.get("cluster_state") == "ok" and fields.get("cluster_known_nodes") == str(2 * PRIMARIES)
                and fields.get("cluster_slots_ok") == "16384")

    def stop(self) -> None:
        for node in self.nodes:
            if node.process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGTERM)
        for node in self.nodes:
            try:
                node.process.wait(10)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(node.process.pid, signal.SIGKILL)
                node.process.wait()


def replicas_streaming(cluster: RedisClusterProcs, *, timeout_s: float = 15.0) -> None:
    """Return once every primary's replica acknowledged a write (``WAIT 1``). After the diskless
    full sync of a new cluster a Redis 7.0 primary streams nothing to its replica until the
    replica's first ``REPLCONF ACK`` (docs/cluster.md), up to a second later on a busy machine:
    a test whose first ``WAIT`` must succeed calls this first."""
    from redis.crc import key_slot

    deadline = time.monotonic() + timeout_s
    with cluster.nodes[0].client() as r:
        slots: Any = r.execute_command("CLUSTER", "SLOTS")
    for start, end, primary, *_ in slots:
        port, first, last = int(primary[1]), int(start), int(end)
        # No bound on the search: a slot migrated by an earlier test of the package makes a range
        # of one slot, which about 0.2 % of slots miss in 100,000 names (a flake seen in CI).
        # One slot takes 16,384 names on average.
        key = next(k for k in (f"vx:test:{{streaming-{i}}}" for i in itertools.count())
                   if first <= key_slot(k.encode()) <= last)
        node = next(n for n in cluster.nodes if n.port == port)
        with node.client() as r:
            r.set(key, "1", ex=60)
            while int(r.execute_command("WAIT", 1, 200)) < 1:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the replica of {port} acknowledged nothing in {timeout_s} s")


@contextlib.contextmanager
def killable_cluster(prefix: str = "voxroom-cluster-kill-", timeout_s: float = 30.0) -> Iterator[RedisClusterProcs]:
    """A cluster of the caller's own, ready for a primary to die: every replica finished its first
    sync (a replica that never did may not be promoted: its data counts as too old, and the
    cluster says ok before that) and streams (:func:`replicas_streaming`)."""
    with tempfile.TemporaryDirectory(prefix=prefix) as tmp:
        cluster = RedisClusterProcs(Path(tmp))
        try:
            cluster.start()
            deadline = time.monotonic() + timeout_s
            while not all(_synced(n) for n in cluster.nodes):
                if time.monotonic() > deadline:
                    raise TimeoutError("replicas not in sync")
                time.sleep(0.1)
            replicas_streaming(cluster, timeout_s=timeout_s)
            yield cluster
        finally:
            cluster.stop()


def _synced(node: ClusterNode) -> bool:
    with node.client() as r:
        info = r.info("replication")
    return bool(info["role"] == "master" or info.get("master_link_status") == "up")


@dataclass
class TlsClusterNode(ClusterNode):
    tls: TlsFiles

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0?{self.tls.url_query()}"

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port, socket_timeout=5, ssl=True, ssl_ca_certs=str(self.tls.ca),
                           ssl_certfile=str(self.tls.cert), ssl_keyfile=str(self.tls.key))


@dataclass
class TlsRedisClusterProcs(RedisClusterProcs):
    """The same 3+3 cluster, TLS only: no plain port (``--port 0``), the cluster bus and the
    replication over TLS too, every client (nodes included) showing a certificate of the CA."""

    tls: TlsFiles | None = None

    def start(self) -> TlsRedisClusterProcs:
        self.tls = TlsFiles.make(self.data_dir)
        super().start()
        return self

    def _files(self) -> TlsFiles:
        assert self.tls is not None, "start() makes the certificates"
        return self.tls

    def _port_args(self, port: int) -> list[str]:
        tls = self._files()
        return ["--port", "0", "--tls-port", str(port), "--tls-cluster", "yes", "--tls-replication", "yes",
                *tls.server_args()]

    def _node(self, port: int, bus: int, proc: subprocess.Popen[bytes]) -> ClusterNode:
        return TlsClusterNode(port, bus, proc, self._files())

    def _cli_args(self) -> list[str]:
        tls = self._files()
        return ["--tls", "--cacert", str(tls.ca), "--cert", str(tls.cert), "--key", str(tls.key)]


@contextlib.contextmanager
def tls_cluster() -> Iterator[TlsRedisClusterProcs]:
    """A TLS cluster of its own (not the package's shared plain one), stopped on exit."""
    with tempfile.TemporaryDirectory(prefix="voxroom-tls-cluster-") as tmp:
        cluster = TlsRedisClusterProcs(Path(tmp))
        try:
            yield cluster.start()
        finally:
            cluster.stop()


