"""``redis-cli --cluster reshard`` of busy rooms loses nothing (issue 17), through the real
gateways and workers.

On a cluster of its own (the reshard changes the slot layout the shared cluster's tests assume):
2 gateway and 2 worker processes (``--engine synthetic``); several rooms each saying a sequence of
lines (the speaker on gateway A, a listener on gateway B and one on gateway A). While they speak,
``redis-cli --cluster reshard`` moves one primary's lowest slots to another primary: two job shards
(``{j0}``, ``{j1}``) and two index shards among them, which every room hands its lines to. Half the
rooms' own slots move with their shard; the other half stay (only their shard moves).

During a slot's migration a script whose keys are split between the source and the target (or
that names a key that does not exist yet) is answered ``TRYAGAIN``, a single key ``ASK``: the
gateway's per-node autopipeline, the worker's routed calls, the reads and the worker's shard
reader retry those. Every ``say`` is answered ``accepted`` once (``unavailable`` retried with the
same seq, as a client does), every listener hears every line whole (chunks ``0..n-1``), once, in
order, and no line is begun twice (no ``restart``: nothing failed, so nothing may be redone).
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from redis.cluster import RedisCluster
from redis.crc import key_slot

from tests.cluster.test_cluster_reads import _node_id, _own_slots, _room_in_slot
from tests.cluster.test_cluster_rooms import _assert_heard, _say_until_accepted
from tests.support.cluster import ClusterNode, RedisClusterProcs
from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.room_client import RoomClient
from tests.support.stores import Stores
from voxroom.store import keys
from voxroom.store.clients import cluster_client, cluster_from_url
from voxroom.store.cluster.calls import ClusterCalls
from voxroom.store.cluster.pipeline import ClusterAutoPipeline

JOB_SHARDS = 12
"""The default ``VOXROOM_JOB_SHARDS``: shard k's keys lie in the k-th twelfth of the slots, with
the rooms it serves (keys.shard_tag)."""
MOVED_SLOTS = 2400
"""How many of the source's lowest slots move: with ``redis-cli --cluster create``'s layout the
first primary holds 0-5460, so slots 0-2399 hold job shards 0 and 1 (slots 383, 2110) and index
shards 0 and 1 (1114, 2121): the rooms of slots 0-2730 hand their lines to a shard that moves."""
ROOMS = 4
MAX_LINES = 40
"""A speaker says lines until the reshard is over, then 2 more: at most this many."""
PIPELINE = 3
"""Keys per ``MIGRATE`` (redis-cli's ``--cluster-pipeline``, 10 by default): fewer than a room
holds, so a room's keys are split between the two nodes for a moment and its scripts see
``TRYAGAIN``."""


def _source(cluster: RedisClusterProcs) -> tuple[ClusterNode, list[int]]:
    """The primary holding slot 0, and its slots in the order redis-cli moves them (lowest first)."""
    for node in cluster.primaries():
        with node.client() as r:
            owned = sorted(_own_slots(r))
        if owned and owned[0] == 0:
            return node, owned
    raise AssertionError("no primary holds slot 0")


def _rooms_in(slots: list[int], moving_shards: set[int]) -> list[str]:
    """:data:`ROOMS` rooms handing their lines to a shard in ``moving_shards``: every other one in
    ``slots``, spread over them (so they move at different moments of the reshard, with their
    shard), the others outside them (only their shard moves)."""
    tag = uuid.uuid4().hex[:6]
    bands = [slots[i * len(slots) // ROOMS:(i + 1) * len(slots) // ROOMS] for i in range(ROOMS)]
    rooms: list[str] = []
    i = 0
    for n, band in enumerate(bands):
        lo, hi = band[0], band[-1]
        while True:
            room = f"rs-{tag}-{i}"
            i += 1
            slot = key_slot(keys.room_state(room).encode())
            inside = lo <= slot <= hi if n % 2 == 0 else slot not in slots
            if inside and keys.shard_of(room, JOB_SHARDS) in moving_shards:
                rooms.append(room)
                break
    return rooms


def _holder_port(cluster: RedisClusterProcs, key: str) -> int:
    slot = key_slot(key.encode())
    for node in cluster.primaries():
        with node.client() as r:
            if slot in _own_slots(r):
                return node.port
    raise AssertionError(f"no primary holds slot {slot}")


def _runs(client: RoomClient) -> list[str]:
    """What a listener got, in order, with runs of frames of one line folded: ``19:0-40``."""
    out: list[str] = []
    for item in client.got.stream:
        if isinstance(item, dict):
            if item.get("type") in ("start", "end"):
                out.append(f"{item['type']} {item['utterance']}")
            continue
        last = out[-1] if out else ""
        if last.startswith(f"{item.seq}:") and int(last.split("-")[-1]) == item.chunk - 1:
            out[-1] = f"{last.split('-')[0]}-{item.chunk}"
        else:
            out.append(f"{item.seq}:{item.chunk}-{item.chunk}")
    return out


async def _reshard(source: ClusterNode, target: ClusterNode) -> tuple[str, float]:
    cli = shutil.which("redis-cli")
    assert cli is not None
    started = time.monotonic()
    proc = await asyncio.create_subprocess_exec(
        cli, "--cluster", "reshard", f"127.0.0.1:{source.port}", "--cluster-from", _node_id(source),
        "--cluster-to", _node_id(target), "--cluster-slots", str(MOVED_SLOTS), "--cluster-pipeline", str(PIPELINE),
        "--cluster-yes", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    text = out.decode(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    return text, time.monotonic() - started


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[RedisClusterProcs]:
    """A 3+3 cluster of this module's own: its slots are moved about."""
    with tempfile.TemporaryDirectory(prefix="voxroom-cluster-reshard-") as tmp:
        cluster = RedisClusterProcs(Path(tmp))
        try:
            yield cluster.start()
        finally:
            cluster.stop()


def _open_slot(source: ClusterNode, target: ClusterNode, slot: int) -> None:
    """The first steps of ``redis-cli --cluster reshard`` for one slot."""
    with source.client() as src, target.client() as dst:
        dst.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", _node_id(source))
        src.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", _node_id(target))


def _migrate(source: ClusterNode, target: ClusterNode, *moving: str) -> None:
    with source.client() as src:
        src.execute_command("MIGRATE", "127.0.0.1", target.port, "", 0, 5000, "KEYS", *moving)


def _close_slot(cluster: RedisClusterProcs, target: ClusterNode, slot: int) -> None:
    """The last step: every primary is told the slot is the target's (the target first)."""
    others = [n for n in cluster.primaries() if n.port != target.port]
    for node in (target, *others):
        with node.client() as r:
            r.execute_command("CLUSTER", "SETSLOT", slot, "NODE", _node_id(target))


_BUMP = """
redis.call('HINCRBY', KEYS[1], 'n', 1)
redis.call('XADD', KEYS[2], '*', 'f', 'v')
return redis.call('HGET', KEYS[1], 'n')
"""


async def test_a_script_over_a_slot_split_between_two_nodes_waits_for_it(own_cluster: RedisClusterProcs) -> None:
    """A room's slot half moved (its ``:state`` on the target, its ``:out`` still on the source):
    a script over both is answered ``TRYAGAIN`` by both nodes until the rest moves. The gateway's
    autopipeline and the worker's routed calls send it again (with a backoff) rather than fail;
    each runs once, after the move. A single key follows ``ASK`` meanwhile."""
    cluster = own_cluster
    source, owned = _source(cluster)
    target = next(n for n in cluster.primaries() if n.port != source.port)
    slot = owned[MOVED_SLOTS + 7]  # outside the range the reshard test moves
    room = _room_in_slot(slot)
    state, out = keys.room_state(room), keys.room_output(room)
    raw = await cluster_from_url(cluster.url, decode_responses=False)
    pipe = ClusterAutoPipeline(raw)
    calls = ClusterCalls(cluster_client(cluster.url, decode_responses=True))
    try:
        assert await calls.call("EVAL", _BUMP, 2, state, out) == "1"
        _open_slot(source, target, slot)
        _migrate(source, target, state)
        assert await calls.call("HGET", state, "n") == "1"  # ASK, followed
        assert await pipe.call("HGET", state, "n") == b"1"
        bumps = [asyncio.create_task(pipe.call("EVAL", _BUMP, 2, state, out)),
                 asyncio.create_task(calls.call("EVAL", _BUMP, 2, state, out))]
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not (pipe.retries and calls.retries):
            assert loop.time() < deadline, "no TRYAGAIN seen"
            assert not any(b.done() for b in bumps), [b.result() for b in bumps if b.done()]
            await asyncio.sleep(0.02)
        _migrate(source, target, out)
        _close_slot(cluster, target, slot)
        done = await asyncio.gather(*bumps)
        assert sorted([int(done[0]), int(done[1])]) == [2, 3]  # each ran once
        assert await calls.call("XLEN", out) == 3
        with target.client() as t:
            assert int(t.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) == 2
    finally:
        await pipe.aclose()
        await raw.aclose()
        await calls.aclose()


async def test_a_shard_read_blocked_when_its_slot_moves_reads_on(own_cluster: RedisClusterProcs, stores: Stores) -> None:
    """Redis 7 answers a read blocked on a stream that ``MIGRATE`` took away ``UNBLOCKED``: the
    worker's shard reader reads on, on the shard's new node, instead of failing its intake."""
    cluster = own_cluster
    source, owned = _source(cluster)
    target = next(n for n in cluster.primaries() if n.port != source.port)
    shard = next(k for k in range(JOB_SHARDS) if key_slot(keys.job_shard(k, JOB_SHARDS).encode()) in owned[MOVED_SLOTS:])
    stream = keys.job_shard(shard, JOB_SHARDS)
    slot = key_slot(stream.encode())
    calls = ClusterCalls(cluster_client(cluster.url, decode_responses=True))
    jobs = await stores.bus(cluster.url, "c-reshard", job_shards=JOB_SHARDS)
    try:
        await jobs.ensure_group()
        reading = asyncio.create_task(jobs.read_jobs(1, 3000))
        await asyncio.sleep(0.3)  # every shard's read is blocked now
        _open_slot(source, target, slot)
        with source.client() as src:
            moving = src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, 100)
        _migrate(source, target, *moving)
        _close_slot(cluster, target, slot)
        assert await reading == []  # unblocked with nothing, not an error
        room = next(r for i in range(10_000) if keys.shard_of(r := f"rj-{i}", JOB_SHARDS) == shard)
        await calls.call("XADD", stream, "*", "room", room, "seq", 1, "text", "hello", "voice", "en-joe")
        got = await jobs.read_jobs(1, 3000)
        assert [(j.room, j.seq) for j in got] == [(room, 1)], got
        assert await jobs.ack(got[0])  # not left for the next test's workers to claim
        assert _holder_port(cluster, stream) == target.port
    finally:
        await calls.aclose()


@pytest.mark.timeout(240)
async def test_redis_cli_reshard_of_busy_rooms_loses_nothing(own_cluster: RedisClusterProcs, tmp_path: Path) -> None:
    cluster = own_cluster
    source, owned = _source(cluster)
    moving = owned[:MOVED_SLOTS]
    assert moving == list(range(MOVED_SLOTS)), "redis-cli --cluster create gave another layout"
    target = next(n for n in cluster.primaries() if n.port != source.port)
    moving_shards = {k for k in range(JOB_SHARDS) if key_slot(keys.job_shard(k, JOB_SHARDS).encode()) < MOVED_SLOTS}
    moving_index = {k for k in range(JOB_SHARDS) if key_slot(keys.rooms_shard(k, JOB_SHARDS).encode()) < MOVED_SLOTS}
    assert moving_shards == moving_index == {0, 1}
    rooms = _rooms_in(moving, moving_shards)
    others = [n for n in cluster.nodes if n.port not in (source.port, target.port)]
    procs: list[Proc] = []
    try:
        gateways = []
        for node in (source, others[0]):  # one gateway seeded by the node giving the slots away
            proc, port = start_gateway(node.url, tmp_path)
            procs.append(proc)
            gateways.append(port)
        workers = [start_worker(node.url, tmp_path, engine="synthetic", name=f"worker-{i}")
                   for i, node in enumerate(others[1:3])]
        procs += workers
        accepted: dict[str, list[int | None]] = {r: [] for r in rooms}
        under_way = asyncio.Event()
        resharding = asyncio.Event()
        resharded = asyncio.Event()

        async def speak(room: str, speaker: RoomClient, listener: RoomClient) -> None:
            after = 0
            for n in range(1, MAX_LINES + 1):
                if n == 3:
                    under_way.set()
                    await resharding.wait()  # lines 3.. are said while the slots move
                accepted[room].append(await _say_until_accepted(speaker, f"Line {n} in room {room}.", n))
                if resharded.is_set():
                    after += 1
                    if after == 2:  # and two once they have moved
                        return
                # At the pace they are spoken (about a second a line), so that every room has one
                # line playing and one waiting while its slot moves, not a long backlog.
                await listener.wait_for(lambda g, at=n: any(m["utterance"] == at for m in g.of("start")), 60)

        async def reshard_when_busy() -> tuple[str, float]:
            await under_way.wait()
            task = asyncio.create_task(_reshard(source, target), name="test:reshard")
            await asyncio.sleep(0.05)
            resharding.set()
            try:
                return await task
            finally:
                resharded.set()

        async with contextlib.AsyncExitStack() as stack:
            a, b = gateways
            speakers = [await stack.enter_async_context(RoomClient(a, r)) for r in rooms]
            near = [await stack.enter_async_context(RoomClient(a, r)) for r in rooms]
            far = [await stack.enter_async_context(RoomClient(b, r)) for r in rooms]
            _, (out, took) = await asyncio.gather(
                asyncio.gather(*(speak(r, s, n) for r, s, n in zip(rooms, speakers, near, strict=True))),
                reshard_when_busy())
            said = {room: len(accepted[room]) for room in rooms}
            for room, listener in [*zip(rooms, near, strict=True), *zip(rooms, far, strict=True)]:
                await listener.wait_ends(said[room], timeout=120)
            await asyncio.sleep(0.5)  # anything said twice would arrive by now
            unavailable = sum(1 for s in speakers for m in s.got.of("error") if m["code"] == "unavailable")
            print(f"reshard of {MOVED_SLOTS} slots took {took:.1f} s; lines said {said}; unavailable answers: "
                  f"{unavailable}; rooms (slot, shard) "
                  f"{[(key_slot(keys.room_state(r).encode()), keys.shard_of(r, JOB_SHARDS)) for r in rooms]}")
            for room in rooms:
                assert said[room] < MAX_LINES, "the reshard outlasted the lines"
                assert accepted[room] == list(range(1, said[room] + 1)), (room, accepted[room])
            for room, listener in [*zip(rooms, near, strict=True), *zip(rooms, far, strict=True)]:
                assert not [m for m in listener.got.of("start") if m.get("restart")], listener.got.of("start")
                try:
                    _assert_heard(listener, said[room])
                except AssertionError:
                    print(f"{room} heard ({listener.url}):", _runs(listener))
                    raise
            for here, there in zip(near, far, strict=True):
                assert [(f.seq, f.chunk, f.payload) for f in here.got.frames] == \
                       [(f.seq, f.chunk, f.payload) for f in there.got.frames]
        assert all(w.alive() for w in workers)
        logs = [proc.log_text() for proc in procs]
        print("shard reads unblocked:", sum(log.count("unblocked (UNBLOCKED") for log in logs),
              "reads moved:", sum(log.count(" moved to ") for log in logs))
        for log in logs:
            # A line a worker could not write is left for a claim and begun again; a hand-off
            # that failed is left to the sweeper: neither may happen, nor a loop die.
            for bad in ("left for a claim", "left to the sweeper", "Traceback"):
                assert bad not in log, log[-3000:]

        # The slots moved: the rooms' keys, the job shards' and the index shards' are on the target.
        assert "Moving slot" in out, out[-2000:]
        with RedisCluster(host="127.0.0.1", port=target.port, socket_timeout=5, decode_responses=True) as rc:
            for room in rooms:
                slot = key_slot(keys.room_state(room).encode())
                now, before = (target, source) if slot in moving else (source, target)
                assert _holder_port(cluster, keys.room_state(room)) == now.port
                with now.client() as t, before.client() as s:
                    assert int(t.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) >= 3
                    assert int(s.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot)) == 0
                state = rc.hgetall(keys.room_state(room))
                assert int(state["next"]) == said[room] + 1 and int(state["handed"]) == said[room], state
                assert not [f for f in state if f.startswith("owner:")], state
                shard = int(state["shard"])
                jobs = [f for _, f in rc.xrange(keys.job_shard(shard, JOB_SHARDS)) if f.get("room") == room]
                assert [int(f["seq"]) for f in jobs] == list(range(1, said[room] + 1)), (room, jobs)
                pending = rc.xpending(keys.job_shard(shard, JOB_SHARDS), keys.JOBS_GROUP)
                assert pending["pending"] == 0, (shard, pending)
                assert rc.zscore(keys.rooms_shard(keys.shard_of(room, JOB_SHARDS), JOB_SHARDS), room) is not None
            for k in moving_shards:
                assert _holder_port(cluster, keys.job_shard(k, JOB_SHARDS)) == target.port
                assert _holder_port(cluster, keys.rooms_shard(k, JOB_SHARDS)) == target.port
    finally:
        for proc in procs:
            proc.stop()

