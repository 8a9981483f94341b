"""The speech API's private rooms on the real 3+3 cluster: workers never trim them (the cluster's
publish scripts, voxroom/store/cluster/jobs.py), so a slow reader gets every byte (tests/api/slow_reader.py)."""

from __future__ import annotations

import asyncio
from pathlib import Path

from redis.cluster import RedisCluster

from tests.api.slow_reader import PCM_BYTES_PER_S, WORKER_ENV, read_slowly
from tests.cluster.conftest import RedisClusterProcs
from tests.support.processes import start_gateway, start_worker
from voxroom.store import keys


async def test_a_slow_reader_gets_every_byte_on_the_cluster(redis_cluster: RedisClusterProcs, tmp_path: Path) -> None:
    nodes = redis_cluster.nodes
    worker = start_worker(nodes[1].url, tmp_path, engine="synthetic", contexts=2, **WORKER_ENV)
    gateway, port = start_gateway(nodes[0].url, tmp_path)
    rc = RedisCluster.from_url(redis_cluster.url, socket_timeout=5)

    def length_now() -> int:
        pattern = keys.room_output(keys.PRIVATE_ROOM_PREFIX + "*")
        names = [k for node in rc.get_primaries() for k in rc.scan_iter(match=pattern, target_nodes=node)]
        return sum(int(rc.xlen(k)) for k in names)

    async def stream_length() -> int:
        return await asyncio.to_thread(length_now)

    try:
        fast, slow, most = await read_slowly(port, stream_length)
    finally:
        rc.close()
        gateway.stop()
        worker.stop()
    assert fast.complete and len(fast.body) > 200 * PCM_BYTES_PER_S
    assert slow.complete, slow.ended
    assert len(slow.body) == len(fast.body), f"{(len(fast.body) - len(slow.body)) / PCM_BYTES_PER_S:.1f} s missing"
    assert bytes(slow.body) == bytes(fast.body)
    assert 0 < most < 0.75 * (len(fast.body) // 1920), most
