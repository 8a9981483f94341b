"""The real Redis Cluster of tests/support/cluster.py for this package: started once for it and
torn down after it."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.cluster import RedisClusterProcs
from voxroom.store.server import RedisServer


@pytest.fixture(scope="package")
def redis_cluster() -> Iterator[RedisClusterProcs]:
    with tempfile.TemporaryDirectory(prefix="voxroom-cluster-") as tmp:
        cluster = RedisClusterProcs(Path(tmp))
        try:
            yield cluster.start()
        finally:
            cluster.stop()


@pytest.fixture(scope="package")
def single_redis() -> Iterator[RedisServer]:
    """A private single-instance Redis (the default deployment) for this package: its synthetic
    worker must not take the other packages' jobs."""
    with RedisServer() as server:
        yield server
