"""End to end on the real 3+3 cluster: 2 gateway and 2 worker processes, each given ``REDIS_URL``
naming a different node (a replica among them), speak rooms that lie on all three primaries.

Every listener, on either gateway, gets each line's ``start``, all its frames in order and its
``end`` ok, each line once; both listeners of a room get the same audio. ``redis-cli -c`` reads a
room's log from a node that does not hold it, as docs/cluster.md shows, and ``voxroom rooms``
lists the rooms from the index shards.
"""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from redis.cluster import RedisCluster

from tests.support.cluster import RedisClusterProcs
from tests.support.processes import ROOT, Proc, base_env, start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.runtime.settings import Settings
from voxroom.store import keys
from voxroom.wire.protocol import ROOM_RATE

ROOMS_PER_PRIMARY = 2
LINES = 3


@dataclass
class ClusterStack:
    gateways: list[int]
    """Their ports."""
    workers: list[Proc]
    rooms: list[str]
    holder: dict[str, int]
    """Room -> port of the primary holding its slot."""


@pytest.fixture(scope="module")
def stack(redis_cluster: RedisClusterProcs, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ClusterStack]:
    logs = tmp_path_factory.mktemp("cluster-stack")
    nodes = redis_cluster.nodes
    procs: list[Proc] = []
    try:
        gateways = []
        for node in nodes[:2]:
            proc, port = start_gateway(node.url, logs)
            procs.append(proc)
            gateways.append(port)
        # A short context queue: neither worker can take every room's first line alone.
        workers = [start_worker(node.url, logs, engine="synthetic", name=f"worker-{i}", VOXROOM_CONTEXT_QUEUE="2")
                   for i, node in enumerate(nodes[2:4])]
        procs += workers
        with RedisCluster.from_url(redis_cluster.url, socket_timeout=5) as rc:
            rooms, holder = _rooms_on_every_primary(rc, {n.port for n in redis_cluster.primaries()})
        yield ClusterStack(gateways, workers, rooms, holder)
    finally:
        for proc in procs:
            proc.stop()


def _rooms_on_every_primary(rc: RedisCluster, primaries: set[int]) -> tuple[list[str], dict[str, int]]:
    routed: Any = rc  # redis-py's get_node_from_key is untyped
    tag = uuid.uuid4().hex[:6]
    per: dict[int, list[str]] = {p: [] for p in primaries}
    holder: dict[str, int] = {}
    i = 0
    while any(len(v) < ROOMS_PER_PRIMARY for v in per.values()):
        room = f"e2e-{tag}-{i}"
        i += 1
        node = routed.get_node_from_key(keys.room_state(room))
        if len(per[int(node.port)]) < ROOMS_PER_PRIMARY:
            per[int(node.port)].append(room)
            holder[room] = int(node.port)
    return [r for rooms in per.values() for r in rooms], holder


def _assert_heard(client: RoomClient, lines: int) -> None:
    got = client.got
    assert [s["utterance"] for s in got.of("start")] == list(range(1, lines + 1)), got.of("start")
    ends = got.ends()
    assert [e["utterance"] for e in ends] == list(range(1, lines + 1)), ends
    assert all(e["status"] == "ok" for e in ends), ends
    for utterance in range(1, lines + 1):
        mine = got.frames_of(utterance)
        assert mine, f"no audio for line {utterance}"
        assert [f.chunk for f in mine] == list(range(len(mine))), "chunks missing, doubled or out of order"
        assert mine[0].first and mine[-1].last
    assert [f.seq for f in got.frames] == sorted(f.seq for f in got.frames), "lines interleaved"


async def test_rooms_on_every_primary_speak_through_two_gateways_and_two_workers(
        stack: ClusterStack, redis_cluster: RedisClusterProcs) -> None:
    assert len(set(stack.holder.values())) == 3
    a, b = stack.gateways

    async def one_room(room: str) -> tuple[RoomClient, RoomClient]:
        async with RoomClient(a, room) as here, RoomClient(b, room) as there:
            for n in range(LINES):
                # Speakers on both gateways: accepts and hand-offs from both.
                await (here if n % 2 == 0 else there).say(f"Line {n + 1} in room {room}.", voice="en-joe")
            await here.wait_ends(LINES, timeout=60)
            await there.wait_ends(LINES, timeout=60)
            await asyncio.sleep(0.3)  # anything said twice would arrive by now
            return here, there

    results = await asyncio.gather(*(one_room(r) for r in stack.rooms))
    for here, there in results:
        _assert_heard(here, LINES)
        _assert_heard(there, LINES)
        assert [(f.seq, f.chunk, f.payload) for f in here.got.frames] == \
               [(f.seq, f.chunk, f.payload) for f in there.got.frames]
    assert all(w.alive() for w in stack.workers)
    for proc in stack.workers:
        assert "MOVED" not in proc.log_text() and "CROSSSLOT" not in proc.log_text(), proc.log_text()[-2000:]

    with RedisCluster.from_url(redis_cluster.url, socket_timeout=5, decode_responses=True) as rc:
        # Every line once on its room's shard, every job acked, the owner fields cleared.
        for room in stack.rooms:
            state = rc.hgetall(keys.room_state(room))
            assert int(state["next"]) == LINES + 1 and int(state["handed"]) == LINES, state
            assert not [f for f in state if f.startswith("owner:")], state
            shard = keys.job_shard(int(state["shard"]), Settings().job_shards)
            jobs = [f for _, f in rc.xrange(shard) if f.get("room") == room]
            assert [int(f["seq"]) for f in jobs] == list(range(1, LINES + 1))
    # The heartbeats (every 2 s) say how many lines each worker spoke: some each, all in all.
    deadline = asyncio.get_running_loop().time() + 15
    while True:
        published = _published(redis_cluster, stack.workers)
        if sum(published) >= len(stack.rooms) * LINES or asyncio.get_running_loop().time() > deadline:
            break
        await asyncio.sleep(0.5)
    # At least these lines: jobs other tests of the package left on the shared cluster's shards
    # are theirs to speak too (what each room heard is checked exactly above).
    assert sum(published) >= len(stack.rooms) * LINES and len(published) == 2, published
    assert all(p > 0 for p in published), published
    # A gateway's /metrics sums the job shards (the seed node holds only some of them).
    async with httpx.AsyncClient() as http:
        text = (await http.get(f"http://127.0.0.1:{a}/metrics", timeout=10)).text
    gauges = {line.split("{")[0]: float(line.split()[-1]) for line in text.splitlines()
              if line.startswith(("voxroom_jobs_stream_length{", "voxroom_jobs_pending{"))}
    assert gauges.get("voxroom_jobs_stream_length", 0) >= len(stack.rooms) * LINES, gauges
    assert gauges.get("voxroom_jobs_pending") == 0, gauges


def _published(redis_cluster: RedisClusterProcs, workers: list[Proc]) -> list[int]:
    """Lines published by ``workers`` (a worker's id is host-pid-random), from their heartbeats."""
    with RedisCluster.from_url(redis_cluster.url, socket_timeout=5, decode_responses=True) as rc:
        ids = [w for w in rc.zrange(keys.WORKERS, 0, -1) if any(f"-{p.pid}-" in w for p in workers)]
        return [int(rc.hget(keys.worker_heartbeat(w), "published") or 0) for w in ids]

def test_redis_cli_reads_a_room_from_any_node(stack: ClusterStack, redis_cluster: RedisClusterProcs) -> None:
    """docs/cluster.md's recipe: ``redis-cli -c`` follows ``MOVED`` to the room's node."""
    cli = shutil.which("redis-cli")
    assert cli is not None
    room = stack.rooms[0]
    elsewhere = next(n for n in redis_cluster.nodes if n.port != stack.holder[room])
    out = subprocess.run([cli, "-c", "-u", elsewhere.url, "XREVRANGE", keys.room_utterances(room), "+", "-",
                          "COUNT", "10"], capture_output=True, text=True, timeout=30, check=True).stdout
    assert f"Line {LINES} in room {room}." in out and "Line 1 in room" in out, out
    slot = subprocess.run([cli, "-u", elsewhere.url, "CLUSTER", "KEYSLOT", room], capture_output=True, text=True,
                          timeout=30, check=True).stdout.strip()
    with RedisCluster.from_url(redis_cluster.url, socket_timeout=5) as rc:
        assert int(slot) == rc.keyslot(keys.room_state(room))


def test_voxroom_rooms_lists_the_rooms_of_every_shard(stack: ClusterStack, redis_cluster: RedisClusterProcs,
                                                      tmp_path: Path) -> None:
    url = redis_cluster.nodes[5].url
    listing = subprocess.run([sys.executable, "-m", "voxroom_cli", "rooms", "--limit", "500", "--redis-url", url],
                             cwd=ROOT, env=base_env(url), capture_output=True, text=True, timeout=60, check=False)
    assert listing.returncode == 0, listing.stderr
    rows = {line.split()[0]: line.split() for line in listing.stdout.splitlines() if line.startswith("e2e-")}
    for room in stack.rooms:
        assert room in rows, listing.stdout
        cols = rows[room]  # room, idle s, last seq, next, ...
        assert (cols[2], cols[3]) == (str(LINES), str(LINES + 1)), cols
    assert "no live worker" not in listing.stdout
    one = subprocess.run([sys.executable, "-m", "voxroom_cli", "room", stack.rooms[-1], "--redis-url", url],
                         cwd=ROOT, env=base_env(url), capture_output=True, text=True, timeout=60, check=False)
    assert one.returncode == 0, one.stderr
    assert f"Line {LINES} in room {stack.rooms[-1]}." in one.stdout
    assert "no pending job for this room" in one.stdout


async def _say_until_accepted(client: RoomClient, text: str, seq: int, timeout_s: float = 60.0) -> int | None:
    """Send ``say`` ``seq`` until the gateway accepts it (the same seq again after ``unavailable``
    or ``busy``: deduplicated). The room's utterance number, or ``None`` for ``duplicate`` (an
    earlier try was stored after all)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        mark = len(client.got.messages)
        await client.say(text, voice="en-joe", seq=seq)
        await client.wait_for(lambda g, at=mark: any(m.get("seq") == seq and m.get("type") in ("accepted", "error")
                                                     for m in g.messages[at:]), 30)
        reply = next(m for m in client.got.messages[mark:] if m.get("seq") == seq
                     and m.get("type") in ("accepted", "error"))
        if reply["type"] == "accepted":
            return int(reply["utterance"])
        if reply["code"] == "duplicate":
            return None
        assert reply["code"] in ("unavailable", "busy"), reply
        await asyncio.sleep(reply.get("retry_after_ms", 500) / 1000)
    raise TimeoutError(f"say {seq} never accepted")


async def test_speech_api_on_the_cluster(stack: ClusterStack, redis_cluster: RedisClusterProcs) -> None:
    """``POST /v1/audio/speech``: its private room on the cluster, through both gateways."""
    import httpx

    for port in stack.gateways:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
            resp = await http.post("/v1/audio/speech", json={"input": "The village wakes. The seer speaks.",
                                                             "voice": "en-joe", "response_format": "pcm"})
        assert resp.status_code == 200, resp.text[:300]
        assert len(resp.content) > ROOM_RATE * 2 * 0.3, len(resp.content)  # int16 mono: some speech
    with RedisCluster.from_url(redis_cluster.url, socket_timeout=5) as rc:
        # A finished private room is deleted, on whichever node held it: once the response has
        # ended, which the gateway learns after its last byte left (the client may read it first).
        deadline = time.monotonic() + 10
        while True:
            left = [k for node in rc.get_primaries()
                    for k in rc.scan_iter(match=f"{keys.PREFIX}:room:{{_api-*", target_nodes=node)]
            if not left or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.1)
    assert left == [], left
