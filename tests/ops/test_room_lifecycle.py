"""Rooms expire: a room spoken in and abandoned leaves nothing in Redis once
``VOXROOM_ROOM_IDLE_TTL_S`` has passed (no key of it, no ``vx:rooms`` entry, memory back to what it
was), while a room that keeps speaking keeps its keys.

Real parts only: a redis-server of each test's own (its key count and ``used_memory`` are this
test's alone), a synthetic worker and a gateway as processes, real WebSocket clients. The TTL is a
few seconds; every wait below is a deadline polled against Redis, not a sleep that must be long
enough.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from redis.asyncio import Redis

from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from tests.support.stores import Stores
from tests.support.waiting import until
from voxroom.store import keys
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.server import RedisServer
from voxroom.store.single.ingress import STALE_ROOMS_PER_SAY

TTL_S = 8
DEADLINE_S = 60.0
"""How long the test waits for Redis to reach a state: generous, for a busy 2-core machine."""
LINE = "a line that plays for three seconds"
ROOM_KEYS = ("seq", "utt", "state", "out", "senders")
"""The keys every room that spoke has (``:opus`` exists only while an Opus client listens)."""


@dataclass
class Lifecycle:
    redis: RedisServer
    port: int


@pytest.fixture
def lifecycle(tmp_path: Path) -> Iterator[Lifecycle]:
    with RedisServer() as server:
        # No audio cache: it is not a room's, and would keep audio that outlives every room.
        worker = start_worker(server.url, tmp_path, engine="synthetic", contexts=2, VOXROOM_CACHE_SLOTS="0",
                              VOXROOM_ROOM_IDLE_TTL_S=str(TTL_S))
        try:
            gateway, port = start_gateway(server.url, tmp_path, VOXROOM_ROOM_IDLE_TTL_S=str(TTL_S))
            try:
                yield Lifecycle(server, port)
            finally:
                gateway.stop()
        finally:
            worker.stop()


@contextlib.asynccontextmanager
async def redis_of(server: RedisServer) -> AsyncIterator[Redis]:
    r = Redis.from_url(server.url, decode_responses=True)
    try:
        yield r
    finally:
        await r.aclose()


async def all_keys(r: Redis) -> set[str]:
    return {k async for k in r.scan_iter(match="*", count=1000)}


async def room_keys(r: Redis, room: str) -> set[str]:
    return {k.rsplit(":", 1)[-1] async for k in r.scan_iter(match=keys.room_pattern(room), count=1000)}


async def used_memory(r: Redis) -> int:
    info = await r.info("memory")
    return int(info["used_memory"])


async def room_bytes(r: Redis, room: str) -> int:
    """What a room's keys hold, by ``MEMORY USAGE`` (every entry of its streams counted)."""
    return sum([await r.memory_usage(keys.room_key(room, name), samples=0) or 0 for name in ROOM_KEYS])


async def speak(port: int, r: Redis, room: str, lines: int) -> tuple[int, int]:
    """Speak ``lines`` lines one after another, then leave; Redis's ``used_memory`` at the end,
    and what the room's keys hold then."""
    async with RoomClient(port, room) as client:
        for n in range(1, lines + 1):
            await client.say(LINE)
            await client.wait_ends(n, timeout=30)
        assert [(e["utterance"], e["status"]) for e in client.got.ends()] == [(n, "ok") for n in range(1, lines + 1)]
    # Well within the TTL of the last line: the room has every key and its vx:rooms entry.
    assert await room_keys(r, room) == set(ROOM_KEYS), room
    assert await r.zscore(keys.ROOMS, room) is not None
    return await used_memory(r), await room_bytes(r, room)


async def keep_speaking(port: int, room: str, stop: asyncio.Event) -> int:
    """One line after another until ``stop``: the room stays active. Returns the lines played."""
    async with RoomClient(port, room) as client:
        n = 0
        while not stop.is_set():
            n += 1
            await client.say(LINE)
            await client.wait_ends(n, timeout=30)
            assert client.got.ends()[-1]["utterance"] == n
        return n


async def test_abandoned_rooms_leave_nothing_and_an_active_room_keeps_its_keys(lifecycle: Lifecycle) -> None:
    port = lifecycle.port
    async with redis_of(lifecycle.redis) as r:
        # A room joined and never spoken in writes no room key.
        async with RoomClient(port, "lc-silent"):
            pass
        assert await room_keys(r, "lc-silent") == set()
        # The baseline: after one line spoken and its room deleted by hand, so that what the
        # server keeps per process (its dict tables, client buffers, the cached script, the
        # gateway's per-reader wake stream) is in it and what remains later is rooms' or nothing.
        await speak(port, r, "lc-warmup", 1)
        await r.delete(*[keys.room_key("lc-warmup", name) for name in ROOM_KEYS], keys.ROOMS)
        baseline_keys = await all_keys(r)
        baseline_memory = await used_memory(r)

        # Abandoned rooms: one line (the worker creates ``:out`` after the say), two lines, three.
        abandoned = {"lc-one": 1, "lc-two": 2, "lc-two-more": 2}
        spoken = await asyncio.gather(*(speak(port, r, room, n) for room, n in abandoned.items()))
        grown = max(peak for peak, _ in spoken) - baseline_memory
        smallest_room = min(held for _, held in spoken)
        assert grown > 300_000, grown  # the lines' 24 kHz PCM in the output streams

        stop = asyncio.Event()
        active = asyncio.create_task(keep_speaking(port, "lc-active", stop), name="test:lc-active")
        try:
            started = time.monotonic()

            async def abandoned_left() -> list[str]:
                left = []
                for room in abandoned:
                    left += [f"{room}:{name} (ttl {await r.ttl(keys.room_key(room, name))})"
                             for name in sorted(await room_keys(r, room))]
                    if await r.zscore(keys.ROOMS, room) is not None:
                        left.append(f"vx:rooms {room}")
                return left

            async def abandoned_gone() -> bool:
                return not await abandoned_left()

            await until(abandoned_gone, abandoned_left, timeout=DEADLINE_S)
            # Let the active room live past the TTL, kept only by its lines.
            await asyncio.sleep(max(0.0, TTL_S + 3 - (time.monotonic() - started)))
            assert not active.done()
            assert await room_keys(r, "lc-active") == set(ROOM_KEYS)
            assert await r.zscore(keys.ROOMS, "lc-active") is not None
            for name in ("seq", "utt", "state", "senders"):
                ttl = await r.ttl(keys.room_key("lc-active", name))
                assert 0 < ttl <= TTL_S, (name, ttl)
        finally:
            stop.set()
            played = await asyncio.wait_for(active, 60)
        assert played >= 2

        # Now the active room goes quiet too: Redis returns to the baseline.
        async def beyond_baseline() -> set[str]:
            return await all_keys(r) ^ baseline_keys

        async def at_baseline() -> bool:
            return not await beyond_baseline()

        await until(at_baseline, beyond_baseline, timeout=DEADLINE_S)
        assert await r.exists(keys.ROOMS) == 0
        left = await used_memory(r) - baseline_memory
        # The keys are the baseline's; what else may remain is the job stream's and the wake
        # stream's entries (bounded by their MAXLEN), client buffers, and the allocator's and
        # script engine's own: 33 to 74 KB over the baseline in the runs measured (CI, and here),
        # against 600 KB+ the rooms held. Less than the smallest room held means no room's audio
        # is left anywhere in Redis.
        assert left < smallest_room, f"{left} bytes over the baseline; the smallest room held {smallest_room}, " \
                                     f"all of them {grown}"


# -- the say script alone, against a real Redis: the cases the timing above rarely produces ---------


@pytest.fixture
def private_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


async def test_every_key_a_line_touches_gets_the_idle_ttl(private_redis: RedisServer, stores: Stores) -> None:
    async with redis_of(private_redis) as r:
        ingress = await stores.ingress(r, room_idle_ttl_s=600)
        try:
            assert (await ingress.say("ttl-room", "amy", 1, "first", "en-joe")).status == "accepted"
            await r.xadd(keys.room_output("ttl-room"), {"kind": "start", "seq": 1})  # as a worker would
            assert (await ingress.say("ttl-room", "amy", 2, "second", "en-joe")).status == "accepted"
            for name in ROOM_KEYS:
                ttl = await r.ttl(keys.room_key("ttl-room", name))
                assert 590 <= ttl <= 600, (name, ttl)
            assert 590 <= await r.ttl(keys.ROOMS) <= 600
        finally:
            await ingress.aclose()


async def test_stale_room_entries_are_removed_a_bounded_number_per_line(private_redis: RedisServer, stores: Stores) -> None:
    async with redis_of(private_redis) as r:
        old_ms = time.time() * 1000 - 7_200_000  # two hours ago: past a one-hour TTL
        stale = {f"gone-{i}": old_ms for i in range(STALE_ROOMS_PER_SAY + 10)}
        await r.zadd(keys.ROOMS, stale)
        ingress = await stores.ingress(r, room_idle_ttl_s=3600)
        try:
            await ingress.say("fresh-1", "amy", 1, "hello", "en-joe")
            # One line removed at most STALE_ROOMS_PER_SAY of them (oldest first), the next the rest.
            assert await r.zcard(keys.ROOMS) == 1 + 10
            await ingress.say("fresh-2", "amy", 1, "hello", "en-joe")
            assert set(await r.zrange(keys.ROOMS, 0, -1)) == {"fresh-1", "fresh-2"}
        finally:
            await ingress.aclose()


async def test_a_room_whose_counter_expired_before_its_state_counts_on_from_its_turn(
        private_redis: RedisServer, stores: Stores) -> None:
    """``:state`` outlives ``:seq`` when the worker's last publish came after the last line: the next
    line must get the number the room's turn is at, not 1 (which would be stale and never play)."""
    async with redis_of(private_redis) as r:
        await r.hset(keys.room_state("late"), mapping={"next": 8, "voice": "en-joe"})
        ingress = await stores.ingress(r)
        try:
            outcome = await ingress.say("late", "amy", 1, "hello again", "en-joe")
            assert (outcome.status, outcome.utterance) == ("accepted", 8)
            assert await r.get(keys.room_seq("late")) == "8"
        finally:
            await ingress.aclose()


async def test_a_room_whose_state_was_evicted_is_not_stuck_busy(private_redis: RedisServer, stores: Stores) -> None:
    """Under ``maxmemory`` with ``volatile-lru`` any room key may be evicted: a room that lost its
    ``:state`` while lines were waiting starts over from its last number instead of answering
    ``busy`` until ``:seq`` expires."""
    async with redis_of(private_redis) as r:
        ingress = await stores.ingress(r, max_pending_per_room=3)
        try:
            for seq in (1, 2, 3):
                assert (await ingress.say("evicted", "amy", seq, f"line {seq}", "en-joe")).status == "accepted"
            assert (await ingress.say("evicted", "amy", 4, "line 4", "en-joe")).status == "busy"
            await r.delete(keys.room_state("evicted"))
            outcome = await ingress.say("evicted", "amy", 5, "line 5", "en-joe")
            assert (outcome.status, outcome.utterance) == ("accepted", 4)
            assert await r.hget(keys.room_state("evicted"), "next") == "4"
        finally:
            await ingress.aclose()


async def test_under_maxmemory_quiet_rooms_are_evicted_and_jobs_never(private_redis: RedisServer, stores: Stores) -> None:
    """docker-compose.yml's policy on a real Redis with a small budget: rooms keep speaking past it
    because rooms' keys (they all have a TTL) are evicted, least recently used first; every accepted line stays in
    ``vx:jobs``; and once only keys without a TTL are left, a line is refused with OOM (which the
    gateway answers as ``unavailable``), never by dropping a job."""
    async with redis_of(private_redis) as r:
        await r.config_set("maxmemory-policy", "volatile-lru")
        await r.config_set("maxmemory", await used_memory(r) + 4 * 2**20)
        ingress = await stores.ingress(r, room_idle_ttl_s=3600)
        frame = b"\1" * 1958  # one 40 ms slice, as a worker writes it
        accepted = 0
        try:
            for i in range(40):  # 40 rooms x 100 slices x 2 KB: twice the budget
                room = f"evict-{i}"
                assert (await ingress.say(room, "amy", 1, f"line of room {i}", "en-joe")).status == "accepted"
                accepted += 1
                pipe = r.pipeline(transaction=False)
                for _ in range(100):
                    pipe.xadd(keys.room_output(room), {"kind": "chunk", "frame": frame})
                pipe.expire(keys.room_output(room), 3600)
                await pipe.execute()
            stats = await r.info("stats")
            assert int(stats["evicted_keys"]) > 0
            assert await r.xlen(keys.JOBS) == accepted == 40
            # (Which rooms went is Redis's approximate LRU, with a 1 s clock: not asserted.)
            # Redis evicts before each command: the last writes may overshoot by an entry or two.
            assert await used_memory(r) < int((await r.config_get("maxmemory"))["maxmemory"] or 0) + 256_000

            # Only keys without a TTL left to evict: refused, not dropped.
            await r.config_set("maxmemory", 1)
            with pytest.raises(REDIS_DOWN):
                await ingress.say("evict-late", "amy", 1, "one more", "en-joe")
            assert await r.xlen(keys.JOBS) == 40
        finally:
            await r.config_set("maxmemory", 0)
            await ingress.aclose()
