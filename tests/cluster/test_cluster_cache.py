"""The audio cache and the speech API's private rooms on the real 3+3 cluster.

- A line said in a room on one primary, then in a room on another primary, then again in the
  first, is synthesized once: the two later ones are cache hits (the workers' heartbeat
  counters), and all three are the same audio, sample for sample.
- Cache entries (``vx:cache:<n>``, no hash tag: CRC16 of the whole key) stored through the
  worker's routed per-node pipelines land on every primary, and read back whole from each.
- ``POST /v1/audio/speech`` leaves no entry of its private room in the rooms index shards.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import numpy as np
import pytest
from redis.cluster import RedisCluster

from tests.support.cluster import RedisClusterProcs
from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.room_client import RoomClient
from tests.support.stores import Stores
from voxroom.runtime.settings import Settings
from voxroom.store import keys
from voxroom.wire.protocol import ROOM_RATE, SLICE_SAMPLES
from workers.audio_cache.cache import AudioCache, CachedLine

COUNTERS = ("hits", "misses", "stores", "errors")


@dataclass
class CacheStack:
    gateway: int
    workers: list[Proc]


@pytest.fixture(scope="module")
def cache_stack(redis_cluster: RedisClusterProcs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[CacheStack]:
    logs = tmp_path_factory.mktemp("cluster-cache")
    nodes = redis_cluster.nodes
    procs: list[Proc] = []
    try:
        proc, port = start_gateway(nodes[1].url, logs)
        procs.append(proc)
        workers = [start_worker(node.url, logs, engine="synthetic", name=f"cache-worker-{i}")
                   for i, node in enumerate(nodes[2:4])]
        procs += workers
        yield CacheStack(port, workers)
    finally:
        for proc in procs:
            proc.stop()


def _counters(redis_cluster: RedisClusterProcs, workers: list[Proc]) -> dict[str, int]:
    """The cache counters of ``workers``' heartbeats, summed (``published`` too)."""
    with RedisCluster.from_url(redis_cluster.url, socket_timeout=5, decode_responses=True) as rc:
        ids = [w for w in rc.zrange(keys.WORKERS, 0, -1) if any(f"-{p.pid}-" in w for p in workers)]
        beats = [rc.hgetall(keys.worker_heartbeat(w)) for w in ids]
    total = {name: sum(int(b.get(f"cache.{name}", 0)) for b in beats) for name in COUNTERS}
    total["published"] = sum(int(b.get("published", 0)) for b in beats)
    total["beats"] = len(beats)
    return total


async def _settled(redis_cluster: RedisClusterProcs, workers: list[Proc], *, timeout: float = 20.0,
                   **at_least: int) -> dict[str, int]:
    """The counters once they reach ``at_least`` and two heartbeats (2 s apart) agree."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    last: dict[str, int] | None = None
    while True:
        now = _counters(redis_cluster, workers)
        if now == last and all(now[k] >= v for k, v in at_least.items()) and now["beats"] == len(workers):
            return now
        assert loop.time() < deadline, (now, at_least)
        last = now
        await asyncio.sleep(2.2)


def _two_rooms_on_different_primaries(redis_cluster: RedisClusterProcs) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:6]
    with RedisCluster.from_url(redis_cluster.url, socket_timeout=5) as rc:
        routed: Any = rc  # redis-py's get_node_from_key is untyped
        first = f"cache-{tag}-0"
        home = routed.get_node_from_key(keys.room_state(first)).port
        i = 1
        while routed.get_node_from_key(keys.room_state(f"cache-{tag}-{i}")).port == home:
            i += 1
        return first, f"cache-{tag}-{i}"


async def _said(client: RoomClient, text: str) -> np.ndarray[Any, np.dtype[np.int16]]:
    """Say ``text`` as the room's only speaker; its audio once its ``end`` came (ok)."""
    utterance = await client.say(text, voice="en-joe")  # one speaker: its seq is the room's line
    ends = await client.wait_ends(utterance, timeout=60)
    assert [e["utterance"] for e in ends] == list(range(1, utterance + 1)), ends
    assert ends[-1]["status"] == "ok", ends
    frames = client.got.frames_of(utterance)
    assert [f.chunk for f in frames] == list(range(len(frames))) and frames[-1].last
    return client.got.audio(utterance)


async def test_a_line_said_again_in_rooms_on_two_primaries_is_synthesized_once(
        cache_stack: CacheStack, redis_cluster: RedisClusterProcs, stores: Stores) -> None:
    here, there = _two_rooms_on_different_primaries(redis_cluster)
    text = f"The wolves gather at the edge of the village {uuid.uuid4().hex[:8]}."
    # Jobs other tests left on the shared shards may still be spoken by these workers: count
    # from where the counters settle.
    before = await _settled(redis_cluster, cache_stack.workers)
    async with RoomClient(cache_stack.gateway, here) as a, RoomClient(cache_stack.gateway, there) as b:
        first = await _said(a, text)
        stored = await _settled(redis_cluster, cache_stack.workers, stores=before["stores"] + 1)
        assert stored["misses"] - before["misses"] == 1 and stored["hits"] == before["hits"], (before, stored)
        second = await _said(b, text)  # the other primary's room
        third = await _said(a, text)  # the first room again
    after = await _settled(redis_cluster, cache_stack.workers, hits=stored["hits"] + 2)
    assert (after["hits"] - stored["hits"], after["misses"] - stored["misses"]) == (2, 0), (stored, after)
    assert after["stores"] == stored["stores"] and after["errors"] == before["errors"] == 0, after
    assert first.size >= SLICE_SAMPLES * 5, first.size  # some speech: over 0.2 s
    assert np.array_equal(first, second) and np.array_equal(first, third)
    for proc in cache_stack.workers:
        log = proc.log_text()
        assert "audio cache off" not in log and "audio cache store failed" not in log, log[-2000:]
        assert "MOVED" not in log and "CROSSSLOT" not in log, log[-2000:]


async def test_cache_entries_spread_over_every_primary(redis_cluster: RedisClusterProcs, stores: Stores) -> None:
    """What a cluster worker's cache does (workers/launch.py's routed bytes calls), in process."""
    slots = Settings().cache_slots
    store = await stores.open(redis_cluster.url)
    try:
        cache = AudioCache(store.commands(decode=False), puts := store.commands(decode=False), slots=slots,
                           lru_entries=0)
        rng = np.random.default_rng(7)
        lines = {}
        for n in range(30):
            # A fingerprint's shape (64 hex digits) whose head picks slot 37 n: no two share a slot.
            fp = f"{37 * n:015x}" + (uuid.uuid4().hex * 2)[:49]
            pcm = rng.integers(-3000, 3000, SLICE_SAMPLES * (1 + n % 4), dtype=np.int16).astype("<i2").tobytes()
            lines[fp] = pcm
        stored = await asyncio.gather(*(cache.put(fp, pcm) for fp, pcm in lines.items()))
        assert all(stored) and cache.stats.errors == 0
        assert puts.batches_sent < len(lines)  # stores batched per node too
        # Lookups of one loop turn share round trips: read back through a fresh cache (no LRU).
        fresh = AudioCache(lookups := store.commands(decode=False), store.commands(decode=False), slots=slots,
                           lru_entries=0)
        got = await asyncio.gather(*(fresh.get(fp) for fp in lines))
        assert got == [CachedLine(pcm) for pcm in lines.values()]
        assert (fresh.stats.hits, fresh.stats.misses) == (len(lines), 0)
        assert lookups.batches_sent < len(lines)  # lookups batched per node
        slot_keys = {cache.slot_key(fp) for fp in lines}
    finally:
        await cache.aclose()
        await fresh.aclose()
    holders: dict[int, int] = {}
    for node in redis_cluster.primaries():
        with node.client() as direct:  # a plain connection: the node answers for its own slots only
            for key in slot_keys:
                if direct.cluster("KEYSLOT", key) in _slots_of(direct, node.port):
                    assert direct.exists(key) == 1, (key, node.port)
                    assert int(direct.ttl(key)) > 0
                    holders[node.port] = holders.get(node.port, 0) + 1
    assert sum(holders.values()) == len(slot_keys)
    assert len(holders) == 3, holders


def _slots_of(direct: Any, port: int) -> set[int]:
    owned: set[int] = set()
    for start, end, primary, *_ in direct.execute_command("CLUSTER", "SLOTS"):
        if int(primary[1]) == port:
            owned.update(range(int(start), int(end) + 1))
    return owned


async def test_the_speech_api_leaves_no_index_entry(cache_stack: CacheStack,
                                                    redis_cluster: RedisClusterProcs) -> None:
    shards = Settings().job_shards

    def private_entries() -> set[str]:
        with RedisCluster.from_url(redis_cluster.url, socket_timeout=5, decode_responses=True) as rc:
            return {room for k in range(shards) for room in rc.zrange(keys.rooms_shard(k, shards), 0, -1)
                    if room.startswith(keys.PRIVATE_ROOM_PREFIX)}

    before = private_entries()  # other tests' rooms, if any
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{cache_stack.gateway}", timeout=60) as http:
        for text in ("The village wakes.", "The seer speaks. " * 40):  # one line, then several
            resp = await http.post("/v1/audio/speech", json={"input": text, "voice": "en-joe",
                                                             "response_format": "pcm"})
            assert resp.status_code == 200, resp.text[:300]
            assert len(resp.content) > ROOM_RATE * 2 * 0.3, len(resp.content)
    assert private_entries() <= before
