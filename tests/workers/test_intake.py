"""Worker intake, claiming, pool submission, ownership and room key lifetimes, in process against
a real redis-server (one per module, flushed per test: no other worker reads these jobs).

The engine is the synthetic one (it sleeps instead of computing) so that contexts stay busy for
as long as a test needs; rooms named ``_api-*`` publish unpaced (as the speech API's private
rooms do) so that a test need not wait for lines to play in real time.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from redis.asyncio import Redis

from tests.support.outputs import add_jobs, problems, read_out, wait_ends
from tests.support.stores import Stores
from tests.support.waiting import until
from voxroom.store import keys
from voxroom.voices.catalog import Catalog
from voxroom.wire.jobs import Job
from workers.engines.base import Engine
from workers.engines.synthetic import SyntheticEngine
from workers.intake.worker import Worker
from workers.launch import worker_catalog
from workers.pool.pool import ContextPool
from workers.utterance import SliceBuffer, Utterance

LINE = "A line of about forty characters, spoken."  # about 3 s of audio


def make_pool(*, contexts: int = 1, queue: int = 1, inflight: int = 4, max_batch: int = 1,
              ttfc_ms: float = 20.0) -> ContextPool:
    catalog = worker_catalog(Catalog.load(), {"synthetic"})

    def engines(device: str) -> dict[str, Engine]:
        return {"synthetic": SyntheticEngine(ttfc_ms=ttfc_ms, rtf=0.01, max_batch=max_batch)}

    return ContextPool(["cpu"] * contexts, engines, catalog, queue_size=queue, inflight=inflight)


class Running:
    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.task = asyncio.create_task(worker.run(), name="test:worker")

    async def ready(self) -> Running:
        deadline = time.monotonic() + 10
        while not await self.worker.bus.auto.call("EXISTS", keys.worker_heartbeat(self.worker.id)):
            assert not self.task.done(), self.task
            assert time.monotonic() < deadline, "worker did not start"
            await asyncio.sleep(0.02)
        return self

    async def stop(self) -> None:
        self.worker.stop()
        await asyncio.wait_for(self.task, 30)


async def start(stores: Stores, r: Redis, pool: ContextPool, **options: Any) -> Running:
    options.setdefault("claim_idle_ms", 600)
    worker = Worker(await stores.open(r), pool, pool.contexts[0].catalog, shutdown_timeout_s=2.0, **options)
    return await Running(worker).ready()


async def test_claims_that_fill_the_pool_while_a_read_waits_never_kill_intake(r: Redis, raw: Redis,
                                                                              stores: Stores) -> None:
    # A dead worker left three lines pending. The new worker (room for one line in synthesis and
    # one queued) blocks in a read for one job; its claim passes meanwhile fill the pool with the
    # stale lines, which play for seconds; then new lines arrive. Before, the read returned a job
    # the pool could not take: Overloaded, the reader task ended, and every later line stalled.
    await r.xgroup_create(keys.JOBS, keys.JOBS_GROUP, id="0", mkstream=True)
    stale = [f"stale-{i}" for i in range(3)]
    await add_jobs(r, [(room, LINE) for room in stale])
    await r.xreadgroup(keys.JOBS_GROUP, "ghost", {keys.JOBS: ">"}, count=10)
    await asyncio.sleep(0.7)  # idle past claim_idle_ms
    worker = await start(stores, r, make_pool(queue=1, inflight=1))
    try:
        await asyncio.sleep(1.0)  # claim passes every 0.3 s: the pool is full, the read still waits
        fresh = [f"_api-fresh-{i}" for i in range(3)]
        await add_jobs(r, [(room, "A first line.") for room in fresh])
        await add_jobs(r, [(room, "And a second line.") for room in fresh])
        wanted = {**{room: 1 for room in stale}, **{room: 2 for room in fresh}}
        got = await wait_ends(raw, wanted, 60)
        for room, n in wanted.items():
            assert problems(got[room], n) == [], room
        assert worker.worker.supervisor.snapshot()["intake"]["restarts"] == 0, "intake never failed"
        assert (await r.xpending(keys.JOBS, keys.JOBS_GROUP))["pending"] == 0
    finally:
        await worker.stop()


async def test_a_line_claimed_from_a_dead_worker_passes_a_pool_full_of_its_successors(r: Redis,
                                                                                    raw: Redis, stores: Stores) -> None:
    # The dead worker held line 1; this worker read lines 2 and 3 of the same room, which fill its
    # pool (one slot, one queue place) and wait for line 1's turn. Line 1, claimed, must get in
    # anyway: refused for want of room, the room would wait order_wait_ms and skip it.
    await r.xgroup_create(keys.JOBS, keys.JOBS_GROUP, id="0", mkstream=True)
    await add_jobs(r, [("_api-inverted", "The first line.")])
    await r.xreadgroup(keys.JOBS_GROUP, "ghost", {keys.JOBS: ">"}, count=10)
    await add_jobs(r, [("_api-inverted", "The second line."), ("_api-inverted", "The third line.")])
    worker = await start(stores, r, make_pool(queue=1, inflight=1), order_wait_ms=60_000)
    try:
        got = await wait_ends(raw, {"_api-inverted": 3}, 30)
        assert problems(got["_api-inverted"], 3) == []
    finally:
        await worker.stop()


async def test_a_full_pool_reads_again_as_soon_as_a_queue_slot_opens(r: Redis, raw: Redis, stores: Stores) -> None:
    # One context with a queue of one: the first line leaves the queue for synthesis at once and
    # then plays for seconds. The next line (another room) must be read and start playing then,
    # not after the first line has finished playing.
    worker = await start(stores, r, make_pool(queue=1, inflight=4))
    try:
        await add_jobs(r, [("long-room", LINE + " " + LINE)])  # about 6 s, paced in real time
        await asyncio.sleep(0.3)
        await add_jobs(r, [("short-room", "Short.")])
        got = await wait_ends(raw, {"long-room": 1, "short-room": 1}, 30)
        assert problems(got["long-room"], 1) == [] and problems(got["short-room"], 1) == []
        long_end = next(e.entry_id for e in got["long-room"] if e.kind == "end")
        short_end = next(e.entry_id for e in got["short-room"] if e.kind == "end")
        # Stream ids are Redis's clock: the short line was over before the long one ended.
        assert _ms(short_end) < _ms(long_end)
    finally:
        await worker.stop()


async def test_a_batch_takes_only_the_free_slots(r: Redis, raw: Redis, stores: Stores) -> None:
    # docker-compose's values: a batch of 8 and two utterances in flight per context. Three lines
    # at once: the batch takes two, the third waits in the queue for a slot (before, the batch
    # waited on the slot that only its own publishing could give back: the context hung).
    worker = await start(stores, r, make_pool(queue=4, inflight=2, max_batch=8))
    try:
        rooms = [f"_api-batch-{i}" for i in range(3)]
        await add_jobs(r, [(room, LINE) for room in rooms])
        got = await wait_ends(raw, {room: 1 for room in rooms}, 30)
        for room in rooms:
            assert problems(got[room], 1) == [], room
    finally:
        await worker.stop()


async def test_submit_goes_only_to_contexts_holding_the_engine_and_never_raises() -> None:
    pool = make_pool(contexts=2, queue=1)
    del pool.contexts[0].engines["synthetic"]  # as when an optional engine failed to load there
    pool.contexts[0].engines["other"] = SyntheticEngine()
    rooms = iter(range(100))

    def utt() -> Utterance:  # a room of its own each: a room's later lines would wait in the backlog
        job = Job(entry_id="1-0", room=f"x{next(rooms)}", seq=1, text="Hi.", voice="en-joe", prev_voice="en-joe",
                  sender="t", time_ms=0.0)
        return Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))

    assert pool.submit(utt(), "synthetic") is pool.contexts[1]
    assert pool.submit(utt(), "synthetic") is None  # context 1's queue is full; context 0 lacks it
    # The job's voice speaks through synthetic, whatever the caller says: context 0 could only fail
    # it (tests/workers/test_pool_engines.py).
    assert pool.submit(utt(), "other") is None
    pool.close()


async def test_submit_puts_a_rooms_later_lines_behind_its_first_unless_a_context_is_idle() -> None:
    # No runners: nothing leaves the queues, so the loads are what submit saw.
    pool = make_pool(contexts=2, queue=2)

    def utt(room: str, seq: int) -> Utterance:
        job = Job(entry_id=f"{room}-{seq}", room=room, seq=seq, text="Hi.", voice="en-joe", prev_voice="en-joe",
                  sender="t", time_ms=0.0)
        return Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))

    first, second = pool.contexts
    assert pool.submit(utt("flood", 1), "synthetic") is first
    assert pool.submit(utt("flood", 2), "synthetic") is second  # idle: it starts at once
    # Then behind the room's own lines (its backlog), not as first lines over every context.
    for seq in range(3, 8):
        assert pool.submit(utt("flood", seq), "synthetic") is first
    assert (first.queue.ready(), first.queue.held()) == (1, 5)
    assert pool.submit(utt("other", 1), "synthetic") is second  # the least loaded
    assert pool.submit(utt("third", 1), "synthetic") is first
    assert pool.free() == 0, "both queues hold two rooms' next lines"
    pool.close()


async def test_a_job_another_worker_claimed_gets_no_more_writes(r: Redis, raw: Redis, stores: Stores) -> None:
    worker = await start(stores, r, make_pool(), claim_idle_ms=3000)
    try:
        await add_jobs(r, [("fenced", LINE + " " + LINE)])
        deadline = time.monotonic() + 20
        while sum(1 for e in await read_out(raw, "fenced") if e.kind == "chunk") < 5:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.05)
        # Another worker takes the job over, as XAUTOCLAIM does once this one looked dead.
        pending = await r.xpending_range(keys.JOBS, keys.JOBS_GROUP, min="-", max="+", count=1)
        entry_id = pending[0]["message_id"]
        await r.xclaim(keys.JOBS, keys.JOBS_GROUP, "thief", 0, [entry_id], justid=True)
        claimed_at = (await read_out(raw, "fenced"))[-1].entry_id
        await asyncio.sleep(0.2)  # a write that left before the claim may still land
        settled = (await read_out(raw, "fenced"))[-1].entry_id
        await asyncio.sleep(2.5)  # the old owner's publisher and its keeper both had their turn
        after = [e for e in await read_out(raw, "fenced") if e.entry_id > settled]
        assert after == [], f"the old owner still wrote {after[:3]} (claim at {claimed_at})"
        await until(lambda: worker.worker.dropped == 1 and worker.worker.inflight == {},
                    lambda: f"the lost line dropped: dropped {worker.worker.dropped}, {worker.worker.inflight}",
                    timeout=30)
        still = await r.xpending_range(keys.JOBS, keys.JOBS_GROUP, min="-", max="+", count=1)
        assert [p["consumer"] for p in still] == ["thief"], "never acked by the worker that lost it"
    finally:
        await worker.stop()


async def test_lines_waiting_for_their_turn_share_one_blocked_read(r: Redis, raw: Redis, stores: Stores) -> None:
    # Eight rooms, each with a line playing and the next one waiting for its turn: one blocked
    # XREAD watches them all (before: one pooled connection blocked per waiting line).
    worker = await start(stores, r, make_pool(queue=16, inflight=16))
    try:
        rooms = [f"turns-{i}" for i in range(8)]
        await add_jobs(r, [(room, LINE) for room in rooms] + [(room, "Next.") for room in rooms])
        await asyncio.sleep(1.0)  # every first line is playing, every second one waiting
        blocked = []
        for _ in range(5):
            blocked.append(int((await r.info("clients"))["blocked_clients"]))
            await asyncio.sleep(0.2)
        got = await wait_ends(raw, {room: 2 for room in rooms}, 30)
        for room in rooms:
            assert problems(got[room], 2) == [], room
        # The job intake's XREADGROUP and the turn watcher's XREAD.
        assert max(blocked) <= 2, blocked
    finally:
        await worker.stop()


async def test_room_keys_get_the_idle_ttl_and_the_worker_registers(r: Redis, raw: Redis, stores: Stores) -> None:
    worker = await start(stores, r, make_pool(), room_idle_ttl_s=120)
    try:
        await add_jobs(r, [("ttl-room", "Short.")])
        got = await wait_ends(raw, {"ttl-room": 1}, 20)
        assert problems(got["ttl-room"], 1) == []
        for key in (keys.room_output("ttl-room"), keys.room_state("ttl-room")):
            assert 0 < await r.ttl(key) <= 120, key
        wid = worker.worker.id
        deadline = time.monotonic() + 10
        while await r.zscore(keys.WORKERS, wid) is None:
            assert time.monotonic() < deadline, "no vx:workers entry"
            await asyncio.sleep(0.05)
        beat = await r.hgetall(keys.worker_heartbeat(wid))
        assert beat["loops_down"] == "" and beat["loop_restarts"] == "0"
    finally:
        await worker.stop()
    assert await r.zscore(keys.WORKERS, wid) is None, "a worker that stops leaves the registry"
    assert not await r.exists(keys.worker_heartbeat(wid))


async def test_the_output_stream_keeps_the_resume_window_not_a_count(r: Redis, raw: Redis, stores: Stores) -> None:
    # Trimmed by time (XADD MINID ~): entries older than the window go, whole stream nodes at a time.
    # A room's (a private speech room is trimmed by its gateway instead: tests/api/test_speech_slow_reader.py).
    worker = await start(stores, r, make_pool(), resume_window_ms=1000)
    try:
        room = "window"
        short = "A short line."  # about a second of audio: the room is paced, played in real time
        await add_jobs(r, [(room, short)] * 4)

        async def line_4_ended() -> bool:
            # Line 4's end, not four ends: with a one-second window the first lines' ends are
            # trimmed while the later lines play (waiting for four, the test waited out 60 s).
            return any(e.kind == "end" and e.seq == 4 for e in await read_out(raw, room))

        await until(line_4_ended, "line 4 to end", timeout=60)
        written = await r.xlen(keys.room_output(room))
        await asyncio.sleep(1.5)
        await add_jobs(r, [(room, short)])
        deadline = time.monotonic() + 30
        while True:
            out = await read_out(raw, room)
            if any(e.kind == "end" and e.seq == 5 for e in out):
                break
            assert time.monotonic() < deadline, "line 5 did not end"
            await asyncio.sleep(0.05)
        # Older than the window when line 5 began: lines 1 to 4. Trimming drops whole stream nodes
        # (64 KiB, about 16 entries: voxroom/store/redis_config.py), so the tail of line 4 may stay.
        assert written >= 4 * 4 and out[0].seq >= 4, (written, out[:3])
        last = [e for e in out if e.seq == 5]
        assert [e.chunk for e in last if e.kind == "chunk"] == list(range(last[-1].chunks)), "the new line whole"
    finally:
        await worker.stop()


def _ms(entry_id: str) -> int:
    return int(entry_id.split("-")[0])
