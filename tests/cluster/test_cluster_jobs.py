"""Jobs without a cross-slot write (docs/cluster.md), on the real 3+3 cluster of conftest.py.

The gateway's side: lines said in rooms on every primary are accepted in their room's slot and
handed to their room's job shard exactly once each, in order, when the hand-off is repeated,
when it was skipped (a gateway that died between the accept and the hand-off: the sweeper or the
room's next line hands the line), and when two sweepers race. The worker's side: jobs of every
shard are read, once; the room's writes are fenced by the owner field in the room's slot, so a
worker that lost its job writes nothing more, and a line handed twice is spoken by one job only.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import redis

from tests.support.cluster import RedisClusterProcs
from tests.support.stores import Stores
from voxroom.errors import OwnershipLost
from voxroom.store import keys
from voxroom.store.clients import cluster_client
from voxroom.store.cluster.calls import ClusterCalls
from voxroom.store.cluster.ingress import ClusterIngress, Line, RoomMark
from voxroom.store.cluster.pipeline import ClusterAutoPipeline
from voxroom.store.cluster.sweeper import Sweeper
from voxroom.store.interface import IngressOptions
from voxroom.store.jobs import FencedJobBus
from voxroom.store.single.store import SingleStore
from voxroom.wire.jobs import Job

SHARDS = 12
LINES = 4


@pytest.fixture
async def calls(redis_cluster: RedisClusterProcs) -> AsyncIterator[ClusterCalls]:
    cluster = ClusterCalls(cluster_client(redis_cluster.url, decode_responses=True))
    yield cluster
    await cluster.aclose()


@pytest.fixture
async def ingress(redis_cluster: RedisClusterProcs, stores: Stores) -> ClusterIngress:
    ing = await stores.ingress(redis_cluster.url, job_shards=SHARDS, switch_lines=1)
    assert isinstance(ing, ClusterIngress)
    return ing


@pytest.fixture
async def handoffs(calls: ClusterCalls) -> AsyncIterator[Callable[[], ClusterIngress]]:
    """Hand-offs of gateways of their own (each its own per-node pipeline), closed at the end."""
    made: list[ClusterIngress] = []

    def make() -> ClusterIngress:
        made.append(ClusterIngress(ClusterAutoPipeline(calls.cluster, reads=calls.reads), IngressOptions(),
                                   shards=SHARDS))
        return made[-1]

    yield make
    for handoff in made:
        await handoff.aclose()


def new_rooms(prefix: str, n: int) -> list[str]:
    tag = uuid.uuid4().hex[:6]
    return [f"{prefix}-{tag}-{i}" for i in range(n)]


def rooms_on_every_shard(prefix: str, per_shard: int) -> list[str]:
    """New rooms, ``per_shard`` of them on each job shard."""
    tag = uuid.uuid4().hex[:6]
    by_shard: dict[int, list[str]] = {shard: [] for shard in range(SHARDS)}
    i = 0
    while any(len(rooms) < per_shard for rooms in by_shard.values()):
        room = f"{prefix}-{tag}-{i}"
        i += 1
        if len(by_shard[keys.shard_of(room, SHARDS)]) < per_shard:
            by_shard[keys.shard_of(room, SHARDS)].append(room)
    return [room for rooms in by_shard.values() for room in rooms]


def primary_of(redis_cluster: RedisClusterProcs, key: str) -> int:
    """The port of the primary that holds ``key``'s slot."""
    with redis_cluster.nodes[0].client() as node:
        conn: Any = node
        slot = int(conn.execute_command("CLUSTER", "KEYSLOT", key))
        for start, end, primary, *_ in conn.execute_command("CLUSTER", "SLOTS"):
            if start <= slot <= end:
                return int(primary[1])
    raise AssertionError(f"no node holds slot {slot}")


async def jobs_of(calls: ClusterCalls, rooms: list[str]) -> dict[str, list[tuple[int, int, str]]]:
    """Every job of ``rooms`` in every shard: room -> [(shard, seq, text)] in stream order."""
    wanted = set(rooms)
    found: dict[str, list[tuple[int, int, str]]] = {room: [] for room in rooms}
    for shard in range(SHARDS):
        for _entry_id, fields in await calls.call("XRANGE", keys.job_shard(shard, SHARDS), "-", "+"):
            if fields["room"] in wanted:
                found[fields["room"]].append((shard, int(fields["seq"]), fields["text"]))
    return found


def assert_once_in_order(found: dict[str, list[tuple[int, int, str]]], lines: int) -> None:
    for room, jobs in found.items():
        assert [seq for _, seq, _ in jobs] == list(range(1, lines + 1)), (room, jobs)
        assert [text for _, _, text in jobs] == [f"{room} line {seq}" for seq in range(1, lines + 1)], room
        assert {shard for shard, _, _ in jobs} == {keys.shard_of(room, SHARDS)}, (room, jobs)


async def accept_only(handoff: ClusterIngress, room: str, seq: int) -> tuple[RoomMark, Line]:
    """Step 1 alone: the line is accepted in its room, and the gateway "dies" before handing it."""
    now_ms = int(time.time() * 1000)
    outcome, mark, line = await handoff.accept(room, [
        "alice", seq, f"{room} line {seq}", "narrator", now_ms, 1000, 100_000, room, 16, 3600, 0, 64, 1, "", "", "",
        len(f"{room} line {seq}")])
    assert outcome.status == "accepted" and outcome.utterance == seq
    assert mark is not None and line is not None
    return mark, line


async def test_lines_in_rooms_on_every_primary_are_handed_once_in_order(
        redis_cluster: RedisClusterProcs, calls: ClusterCalls, ingress: ClusterIngress) -> None:
    rooms = new_rooms("spread", 24)
    assert {primary_of(redis_cluster, keys.room_state(r)) for r in rooms} == {
        n.port for n in redis_cluster.primaries()}
    assert {primary_of(redis_cluster, keys.job_shard(k, SHARDS)) for k in range(SHARDS)} == {
        n.port for n in redis_cluster.primaries()}

    async def speak(room: str) -> None:
        for seq in range(1, LINES + 1):
            outcome = await ingress.say(room, "alice", seq, f"{room} line {seq}", "narrator")
            assert (outcome.status, outcome.utterance) == ("accepted", seq)
        # A client's retry of a line already accepted is a duplicate, not a new job.
        assert (await ingress.say(room, "alice", LINES, f"{room} line {LINES}", "narrator")).status == "duplicate"

    await asyncio.gather(*(speak(room) for room in rooms))
    assert_once_in_order(await jobs_of(calls, rooms), LINES)
    for room in rooms:
        state = await calls.call("HGETALL", keys.room_state(room))
        assert int(state["handed"]) == LINES and int(state["shard"]) == keys.shard_of(room, SHARDS)
        # The room's log is the source of truth: every line, with what its job needs.
        utt = await calls.call("XRANGE", keys.room_utterances(room), "-", "+")
        assert [int(f["seq"]) for _, f in utt] == list(range(1, LINES + 1))
        assert all("prev_voice" in f for _, f in utt)
        assert await calls.call("ZSCORE", keys.rooms_shard(keys.shard_of(room, SHARDS), SHARDS), room) is not None
        assert await calls.call("EXISTS", keys.JOBS) == 0  # no global job stream on a cluster


async def test_a_hand_off_repeated_adds_each_line_once(calls: ClusterCalls, handoffs: Callable[[], ClusterIngress]) -> None:
    handoff = handoffs()
    rooms = new_rooms("again", 6)
    for room in rooms:
        for seq in range(1, LINES + 1):
            mark, line = await accept_only(handoff, room, seq)
            assert await handoff.hand(room, mark, line)
            assert not await handoff.hand(room, mark, line)  # the shard's mark says it has it
            await handoff.record(room, mark, seq)
            await handoff.record(room, mark, seq)
        # A full catch-up from nothing (the room's record lost) hands nothing new either.
        assert await handoff.catch_up(room, RoomMark(mark.epoch, 0, mark.shard), LINES) == LINES
    assert handoff.handed == len(rooms) * LINES
    assert_once_in_order(await jobs_of(calls, rooms), LINES)


async def test_lines_whose_hand_off_was_lost_are_handed_by_the_sweeper(calls: ClusterCalls, handoffs: Callable[[], ClusterIngress]) -> None:
    handoff = handoffs()
    rooms = new_rooms("crash", 12)
    for room in rooms:
        for seq in range(1, LINES + 1):
            await accept_only(handoff, room, seq)  # accepted, never handed: the gateway died
    assert all(not jobs for jobs in (await jobs_of(calls, rooms)).values())

    # Two gateways' sweepers at once: the room's lease and the shard's mark keep each line once.
    a = Sweeper(handoffs(), "gw-a")
    b = Sweeper(handoffs(), "gw-b")
    await asyncio.gather(a.sweep_once(grace_ms=0), b.sweep_once(grace_ms=0))
    assert a.ingress.handed + b.ingress.handed == len(rooms) * LINES
    assert_once_in_order(await jobs_of(calls, rooms), LINES)
    assert await a.sweep_once(grace_ms=0) == 0  # nothing is behind any more
    for room in rooms:
        assert int(await calls.call("HGET", keys.room_state(room), "handed")) == LINES
        assert await calls.call("EXISTS", keys.room_sweep_lease(room)) == 0


async def test_young_lines_are_left_to_the_gateway_accepting_them(calls: ClusterCalls, handoffs: Callable[[], ClusterIngress]) -> None:
    handoff = handoffs()
    [room] = new_rooms("young", 1)
    await accept_only(handoff, room, 1)
    assert await Sweeper(handoff, "gw-a", grace_ms=60_000).sweep_once() == 0
    assert (await jobs_of(calls, [room]))[room] == []


async def test_the_next_line_hands_a_lost_line_first(calls: ClusterCalls, ingress: ClusterIngress) -> None:
    rooms = new_rooms("gap", 6)
    for room in rooms:
        await accept_only(ingress, room, 1)
        await accept_only(ingress, room, 2)
        for seq in (3, 4):
            assert (await ingress.say(room, "alice", seq, f"{room} line {seq}", "narrator")).status == "accepted"
    assert_once_in_order(await jobs_of(calls, rooms), LINES)


async def _lose_hand_offs_after(calls: ClusterCalls, room: str, mark: RoomMark, kept: int) -> None:
    """What a failover of the shard's primary leaves when its replica had received the room's
    hand-offs up to ``kept`` only, while the room's own primary (another one) recorded the later
    ones as handed: the shard without their jobs, its high-water mark at ``kept``."""
    shard = keys.job_shard(mark.shard, SHARDS)
    for entry_id, fields in await calls.call("XRANGE", shard, "-", "+"):
        if fields["room"] == room and int(fields["seq"]) > kept:
            await calls.call("XDEL", shard, entry_id)
    await calls.call("HSET", keys.job_shard_handed(mark.shard, SHARDS), room, f"{mark.epoch}:{kept}")


async def test_a_line_a_failover_took_from_its_shard_is_handed_again_by_the_next_line(
        calls: ClusterCalls, ingress: ClusterIngress) -> None:
    """Issue 32: the room's :state said line 3 was handed, its shard (on another primary, failed
    over) had lost it. Before, line 4 was handed on top (the shard's mark jumped past 3) and the
    room waited ``order_wait_ms`` (30 s) for a line no worker would ever read, then skipped it.
    The shard refuses to move its mark over a gap, and the gap is handed first."""
    rooms = new_rooms("lost", 4)
    for room in rooms:
        for seq in (1, 2, 3):
            assert (await ingress.say(room, "alice", seq, f"{room} line {seq}", "narrator")).status == "accepted"
        _, mark = await ingress.mark(room)
        assert mark is not None and mark.handed == 3
        await _lose_hand_offs_after(calls, room, mark, kept=2)
        assert (await ingress.say(room, "alice", 4, f"{room} line 4", "narrator")).status == "accepted"
    assert_once_in_order(await jobs_of(calls, rooms), LINES)


async def test_a_line_a_failover_took_from_its_shard_is_handed_again_by_the_sweeper(
        calls: ClusterCalls, handoffs: Callable[[], ClusterIngress]) -> None:
    """The same loss in a room that says nothing more: its turn stays at a line no shard holds,
    and the sweeper, finding the turn unmoved, reads the shard's mark and hands the line again."""
    handoff = handoffs()
    rooms = new_rooms("stuck", 4)
    for room in rooms:
        for seq in range(1, LINES + 1):
            assert (await handoff.say(room, "alice", seq, f"{room} line {seq}", "narrator")).status == "accepted"
        _, mark = await handoff.mark(room)
        assert mark is not None
        await _lose_hand_offs_after(calls, room, mark, kept=LINES - 2)
    sweeper = Sweeper(handoffs(), "gw-a", stuck_s=0.0)
    await sweeper.sweep_once(grace_ms=0)  # sees each room's turn: not stuck yet
    assert all(len(jobs) == LINES - 2 for jobs in (await jobs_of(calls, rooms)).values())
    await sweeper.sweep_once(grace_ms=0)  # the turns did not move: the shards are read
    assert_once_in_order(await jobs_of(calls, rooms), LINES)
    assert await sweeper.sweep_once(grace_ms=0) == 0  # nothing lacks any more


# -- the worker's side ---------------------------------------------------------------------------


@pytest.fixture
async def buses(redis_cluster: RedisClusterProcs, stores: Stores) -> list[FencedJobBus]:
    made = []
    for name in ("worker-a", "worker-b"):
        bus = await stores.bus(redis_cluster.url, f"{name}-{uuid.uuid4().hex[:4]}", job_shards=SHARDS)
        await bus.ensure_group()
        made.append(bus)
    return made


async def settle(bus: FencedJobBus) -> None:
    """Read and ack what earlier tests left in the shards."""
    while jobs := await bus.read_jobs(count=100, block_ms=50):
        for job in jobs:
            await bus.ack(job)


async def drain(bus: FencedJobBus, want: int) -> list[Job]:
    got: list[Job] = []
    for _ in range(50):
        got += await bus.read_jobs(count=5, block_ms=200)
        if len(got) >= want:
            break
    return got


async def test_a_worker_reads_every_shard_and_each_job_once(calls: ClusterCalls, ingress: ClusterIngress,
                                                            buses: list[FencedJobBus]) -> None:
    bus = buses[0]
    await settle(bus)
    rooms = rooms_on_every_shard("read", 3)
    for room in rooms:
        for seq in (1, 2):
            await ingress.say(room, "alice", seq, f"{room} line {seq}", "narrator")
    jobs = await drain(bus, 2 * len(rooms))
    assert sorted((j.room, j.seq) for j in jobs) == sorted((r, s) for r in rooms for s in (1, 2))
    assert {int(j.entry_id.split("/")[0]) for j in jobs} == set(range(SHARDS))
    for room in rooms:  # a room's lines come in order
        assert [j.seq for j in jobs if j.room == room] == [1, 2]
    # Taken: each line's owner in its room names this worker.
    owner = await calls.call("HGET", keys.room_state(rooms[0]), "owner:1")
    assert owner.split("|")[1] == bus.queue.consumer

    # Nothing left: a blocked read wakes for a line said while it waits, on any shard.
    [late] = new_rooms("late", 1)
    reader = asyncio.create_task(bus.read_jobs(count=5, block_ms=5000))
    await asyncio.sleep(0.3)
    await ingress.say(late, "alice", 1, f"{late} line 1", "narrator")
    got = await asyncio.wait_for(reader, 10)
    got += await drain(bus, 1) if not got else []
    assert [(j.room, j.seq) for j in got] == [(late, 1)]
    for job in jobs + got:
        assert await bus.ack(job)


async def test_a_worker_that_lost_its_job_writes_nothing_more(calls: ClusterCalls, ingress: ClusterIngress,
                                                              buses: list[FencedJobBus]) -> None:
    a, b = buses
    await settle(a)
    [room] = new_rooms("fence", 1)
    await ingress.say(room, "alice", 1, f"{room} line 1", "narrator")
    [job] = await drain(a, 1)
    await a.publish(job, [{"type": "start", "seq": "1"}], started=1)

    # a is paused past the claim time: b adopts the job (XAUTOCLAIM) and takes the line.
    [adopted] = [j for j in await b.claim_stale(0, 10) if j.room == room]
    assert adopted.entry_id == job.entry_id
    with pytest.raises(OwnershipLost):
        await a.publish(job, [{"type": "chunk", "seq": "1"}])
    with pytest.raises(OwnershipLost):
        await a.finish(job, {"type": "end", "seq": "1"}, 1000.0)
    with pytest.raises(OwnershipLost):
        await a.skip_to(job)
    assert await a.touch([job.entry_id]) == [job.entry_id]

    await b.publish(adopted, [{"type": "start", "seq": "1", "restart": "1"}], started=1)
    await b.finish(adopted, {"type": "end", "seq": "1"}, 2000.0)
    out = await calls.call("XRANGE", keys.room_output(room), "-", "+")
    assert [f["type"] for _, f in out] == ["start", "start", "end"]
    state = await calls.call("HGETALL", keys.room_state(room))
    assert state["next"] == "2" and "owner:1" not in state
    _, stream_id = adopted.entry_id.split("/")
    assert not await calls.call("EVAL", "return redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)",
                                1, keys.job_shard(keys.shard_of(room, SHARDS), SHARDS), keys.JOBS_GROUP, stream_id)


async def test_a_line_handed_twice_is_spoken_by_one_job(calls: ClusterCalls, ingress: ClusterIngress,
                                                        buses: list[FencedJobBus]) -> None:
    a, b = buses
    await settle(a)
    [room] = new_rooms("twice", 1)
    mark, line = await accept_only(ingress, room, 1)
    assert await ingress.hand(room, mark, line)
    # The shard's mark lost (its primary failed over before replicating it): handed again.
    await calls.call("HDEL", keys.job_shard_handed(mark.shard, SHARDS), room)
    assert await ingress.hand(room, mark, line)
    first = await drain(a, 1)
    second = await drain(b, 1)
    assert [(j.room, j.seq) for j in first + second] == [(room, 1)]  # the other was acked unread
    # One job of the two is pending (the one being spoken), the other was acked.
    ids = [entry_id for entry_id, f in await calls.call("XRANGE", keys.job_shard(mark.shard, SHARDS), "-", "+")
           if f["room"] == room]
    assert len(ids) == 2
    pending = [await calls.call("EVAL", "return redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)",
                                1, keys.job_shard(mark.shard, SHARDS), keys.JOBS_GROUP, entry_id) for entry_id in ids]
    assert sum(1 for p in pending if p) == 1


async def test_single_instance_ingress_is_unchanged(redis_cluster: RedisClusterProcs) -> None:
    """Without a hand-off the one script still writes ``vx:jobs`` with the room: on a cluster
    that is refused, which is why the gateway picks the hand-off there."""
    store = SingleStore(redis_cluster.url)
    ing = store.ingress(IngressOptions())
    with pytest.raises(redis.ResponseError):
        await ing.say("lobby", "alice", 1, "hello", "narrator")
    await ing.aclose()
    await store.aclose()


async def test_a_worker_speaks_lines_of_rooms_on_every_shard(redis_cluster: RedisClusterProcs, calls: ClusterCalls,
                                                             ingress: ClusterIngress, stores: Stores) -> None:
    """A real worker (the synthetic engine, in process) on the cluster: one line in each of rooms
    on every shard is read, spoken once (start, slices, end in its room's ``:out``), its turn
    handed on, its owner field cleared and its job acked. (A room's later lines wait for their
    turn through the worker's turn watcher, which reads rooms per node: not covered here.)"""
    from voxroom.voices.catalog import Catalog
    from workers.engines.base import Engine
    from workers.engines.synthetic import SyntheticEngine
    from workers.intake.worker import Worker
    from workers.launch import worker_catalog
    from workers.pool.pool import ContextPool

    def engines(device: str) -> dict[str, Engine]:
        return {"synthetic": SyntheticEngine(ttfc_ms=5.0, rtf=0.01)}

    catalog = worker_catalog(Catalog.load(), {"synthetic"})
    voice = next(iter(catalog)).id
    pool = ContextPool(["cpu"], engines, catalog, queue_size=4, inflight=64)
    worker = Worker(await stores.open(redis_cluster.url, job_shards=SHARDS), pool, catalog, shutdown_timeout_s=1.0,
                    claim_idle_ms=5000)
    rooms = rooms_on_every_shard("spoken", 1)
    task = asyncio.create_task(worker.run(), name="test:cluster-worker")
    try:
        for room in rooms:
            assert (await ingress.say(room, "alice", 1, "Hello there.", voice)).status == "accepted"
        deadline = time.monotonic() + 60
        while True:
            states = [await calls.call("HGETALL", keys.room_state(room)) for room in rooms]
            if all(state.get("next") == "2" for state in states):
                break
            assert not task.done(), task
            assert time.monotonic() < deadline, states
            await asyncio.sleep(0.1)
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
    raw = ClusterCalls(cluster_client(redis_cluster.url, decode_responses=False))
    for room, state in zip(rooms, states, strict=True):
        assert not [field for field in state if field.startswith("owner:")], (room, state)
        out = await raw.call("XRANGE", keys.room_output(room), "-", "+")  # frames are binary
        kinds = [fields[b"kind"].decode() for _, fields in out]
        assert kinds[0] == "start" and kinds[-1] == "end" and kinds.count("start") == kinds.count("end") == 1
        chunks = [int(fields[b"chunk"]) + i for _, fields in out if fields[b"kind"] == b"chunk"
                  for i in range(int(fields.get(b"slices", 1)))]  # a chunk entry may group slices
        end = out[-1][1]
        assert chunks == list(range(len(chunks))) and len(chunks) >= 5, (room, kinds)
        assert (end[b"status"], int(end[b"chunks"])) == (b"ok", len(chunks))
    spoken = set(rooms)
    for shard in range(SHARDS):  # every job of these rooms acked
        for entry_id, fields in await calls.call("XRANGE", keys.job_shard(shard, SHARDS), "-", "+"):
            if fields["room"] in spoken:
                assert not await calls.call(
                    "EVAL", "return redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)", 1,
                    keys.job_shard(shard, SHARDS), keys.JOBS_GROUP, entry_id), (shard, fields["room"])
    await raw.aclose()
