"""The gateway's side of "survive every fault" (issue #12.2, #12.6, #12.8): joins that do not queue
behind one another, loops that are restarted and reported while down, and Redis out of memory
answered as ``unavailable`` on a socket that stays open. Real redis-server, real worker, real
uvicorn (in this process where the test needs to reach inside the gateway)."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, cast

import httpx
import pytest
import redis
import uvicorn
from starlette.applications import Starlette
from starlette.websockets import WebSocket

from app.fanout.connection import ClientConnection
from app.fanout.hub import RoomHub
from app.ingress.directory import WorkerDirectory
from app.main import create_app
from app.state import GatewayState
from tests.reliability.test_worker_faults import LoadingProxy
from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from tests.support.stores import Stores
from tests.support.waiting import until
from voxroom.runtime.settings import Settings
from voxroom.store import clients as redis_client
from voxroom.store import keys
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.server import RedisServer, free_port


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


# --- joins --------------------------------------------------------------------------------------


async def test_a_crowd_of_joins_to_new_rooms_takes_a_few_round_trips_not_one_each(redis_url: str, stores: Stores) -> None:
    """Before: one gateway-wide lock held across each new room's tail read, 300 joins took 301
    round trips, one after another."""
    redis = redis_client.from_url(redis_url, decode_responses=False)
    hub = RoomHub(await stores.open(redis), f"test-{uuid.uuid4().hex[:6]}")
    tag = uuid.uuid4().hex[:8]
    clients = [ClientConnection(cast(WebSocket, None), room=f"crowd-{tag}-{i}", client_id="c") for i in range(300)]
    # Two clients of one room joining together: the second waits for the first's read, not a lock.
    clients.append(ClientConnection(cast(WebSocket, None), room=clients[0].room, client_id="d"))
    try:
        await hub.join(ClientConnection(cast(WebSocket, None), room=f"crowd-{tag}-warm", client_id="w"))
        batches = hub.control.batches_sent
        await asyncio.gather(*(hub.join(c) for c in clients))
        used = hub.control.batches_sent - batches
        assert used <= 10, f"301 joins took {used} round trips"
        assert len(hub.rooms) == 301 and len(hub.rooms[clients[0].room]) == 2
        # Every room then gets its audio.
        pipe = redis.pipeline(transaction=False)
        for c in clients[:300]:
            pipe.xadd(keys.room_output(c.room), {"kind": "chunk", "seq": 1, "chunk": 0, "frame": b"audio"})
        await pipe.execute()
        async with asyncio.timeout(30):
            while any(c.depth == 0 for c in clients):  # noqa: ASYNC110 (a test polling plain counters)
                await asyncio.sleep(0.05)
    finally:
        await hub.aclose()
        await redis.aclose()


async def test_a_join_that_fails_leaves_no_half_joined_room(stores: Stores) -> None:
    """Redis unreachable at the join: it raises, and the room is not left registered without a
    reader cursor (a later leave or join of it works)."""
    port = free_port()
    redis = redis_client.from_url(f"redis://127.0.0.1:{port}/0", decode_responses=False)
    hub = RoomHub(await stores.open(redis), f"test-{uuid.uuid4().hex[:6]}")
    client = ClientConnection(cast(WebSocket, None), room="nowhere", client_id="c")
    try:
        with pytest.raises(REDIS_DOWN):
            await hub.join(client)
        assert hub.rooms == {} and hub.cursor("nowhere") is None
        await hub.leave(client)  # and leaving never raises
    finally:
        await hub.aclose()
        await redis.aclose()


async def test_the_directory_reads_the_worker_registry_and_reports_loops_down(redis_url: str, stores: Stores) -> None:
    """No SCAN of the keyspace every 2 s: the ``vx:workers`` registry names the workers, their
    heartbeat hashes say what they serve and which of their loops are down."""
    admin = redis.Redis.from_url(redis_url, decode_responses=True)
    text = redis_client.from_url(redis_url, decode_responses=True)
    directory = WorkerDirectory((await stores.open(redis_url)).commands())
    tag = uuid.uuid4().hex[:8]
    alive, troubled, dead = f"alive-{tag}", f"troubled-{tag}", f"dead-{tag}"
    now_ms = int(time.time() * 1000)
    try:
        for name, down in ((alive, ""), (troubled, "intake,heartbeat")):
            admin.hset(keys.worker_heartbeat(name), mapping={"engines": "espeak", "voices": f"v-{tag}",
                                                             "loops_down": down})
            admin.expire(keys.worker_heartbeat(name), 30)
            admin.zadd(keys.WORKERS, {name: now_ms})
        admin.zadd(keys.WORKERS, {dead: now_ms})  # in the registry, its hash expired: not alive
        scans = _calls(admin, "scan")
        await directory.refresh()
        assert _calls(admin, "scan") == scans, "the directory must not scan the keyspace"
        assert {alive, troubled} <= set(directory.workers) and dead not in directory.workers
        assert directory.serves(f"v-{tag}")
        assert directory.loops_down()[troubled] == ["intake", "heartbeat"] and alive not in directory.loops_down()
    finally:
        admin.delete(keys.worker_heartbeat(alive), keys.worker_heartbeat(troubled))
        admin.zrem(keys.WORKERS, alive, troubled, dead)
        admin.close()
        await directory.auto.aclose()
        await text.aclose()


def _calls(admin: redis.Redis, command: str) -> int:
    stats: Any = admin.info("commandstats")
    return int(stats.get(f"cmdstat_{command}", {}).get("calls", 0))


async def test_hub_readers_wait_out_a_redis_loading_its_data(own_redis: RedisServer, stores: Stores) -> None:
    """Redis restarted from a large AOF answers ``-LOADING`` for a while: the room's reader backs
    off (it does not die) and the room's entries reach its client once Redis has loaded."""
    proxy = await LoadingProxy(own_redis.port).start()
    redis_bytes = redis_client.from_url(proxy.url, decode_responses=False)
    direct = redis.Redis.from_url(own_redis.url)
    hub = RoomHub(await stores.open(redis_bytes), f"test-{uuid.uuid4().hex[:6]}")
    client = ClientConnection(cast(WebSocket, None), room="reload", client_id="c")
    try:
        await hub.join(client)
        proxy.loading()
        await until(lambda: proxy.refused > 0, "the reader tried Redis while it was loading", timeout=30)
        proxy.loaded()
        direct.xadd(keys.room_output("reload"), {"kind": "chunk", "seq": 1, "chunk": 0, "frame": b"audio"})
        async with asyncio.timeout(30):
            while client.depth == 0:  # noqa: ASYNC110 (a test polling a plain counter)
                await asyncio.sleep(0.05)
        assert hub.supervisor.snapshot()["hub:reader:0"]["restarts"] == 0, "backed off, never died"
    finally:
        await hub.aclose()
        await redis_bytes.aclose()
        direct.close()
        await proxy.aclose()


# --- one supervisor: a loop that dies is restarted, and /readyz says so while it is down ---------


@contextlib.asynccontextmanager
async def gateway_in_process(redis_url: str) -> AsyncIterator[tuple[Starlette, int]]:
    app = create_app(Settings(redis_url=redis_url, insecure_dev=True))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    task = asyncio.create_task(server.serve(), name="test:gateway")
    try:
        async with asyncio.timeout(20):
            while not server.started:  # noqa: ASYNC110 (uvicorn offers no event for this)
                await asyncio.sleep(0.05)
        yield app, port
    finally:
        server.should_exit = True
        await asyncio.gather(task, return_exceptions=True)


async def readyz(port: int) -> tuple[int, dict[str, Any]]:
    async with httpx.AsyncClient(timeout=10) as http:
        resp = await http.get(f"http://127.0.0.1:{port}/readyz")
    return resp.status_code, resp.json()


async def wait_ready(port: int, want: int, timeout: float = 30.0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            status, body = await readyz(port)
            if status == want:
                return body
            await asyncio.sleep(0.1)


async def test_a_hub_reader_that_dies_is_restarted_and_readyz_names_it_while_down(
        own_redis: RedisServer, tmp_path: Path) -> None:
    worker = start_worker(own_redis.url, tmp_path)
    try:
        async with gateway_in_process(own_redis.url) as (app, port):
            state: GatewayState = app.state.voxroom
            body = await wait_ready(port, 200)
            assert body["loops_down"] == [] and "127.0.0.1" not in str(body), "no Redis address for anyone"
            async with RoomClient(port, "phoenix") as client:
                reader = state.hub.source._readers[0]
                state.supervisor.first_backoff_s = 3.0  # down long enough to be seen
                wire_call = reader.wire.call
                failed = asyncio.Event()

                async def fail_once(*command: Any) -> Any:
                    if not failed.is_set():
                        failed.set()
                        raise RuntimeError("injected: the reader's connection broke in an unexpected way")
                    return await wire_call(*command)

                reader.wire.call = fail_once  # type: ignore[method-assign]
                # The reader is blocked in its read; it fails on the next one (within 2 s).
                body = await wait_ready(port, 503)
                assert body["loops_down"] == ["hub:reader:0"] and "hub:reader:0" in body["status"]
                async with httpx.AsyncClient(timeout=10) as http:
                    metrics = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
                assert 'voxroom_loop_up{loop="hub:reader:0",process="gateway"} 0.0' in metrics
                await wait_ready(port, 200)
                await client.say("The reader is back.", voice="en-espeak")
                ends = await client.wait_ends(1, timeout=30)
                assert ends[0]["status"] == "ok"
                assert [f.chunk for f in client.got.frames_of(1)] == list(range(ends[0]["chunks"]))
    finally:
        worker.stop()


# --- Redis out of memory ---------------------------------------------------------------------------


async def test_a_say_during_redis_oom_is_answered_unavailable_and_the_socket_stays_open(
        own_redis: RedisServer, tmp_path: Path) -> None:
    worker = start_worker(own_redis.url, tmp_path)
    gateway, port = start_gateway(own_redis.url, tmp_path)
    admin = redis.Redis.from_url(own_redis.url)
    try:
        async with RoomClient(port, "famine") as client:
            await client.say("Before the famine.", voice="en-espeak")
            await client.wait_ends(1, timeout=30)
            admin.config_set("maxmemory-policy", "noeviction")
            admin.config_set("maxmemory", 1)  # below what it uses: every write is refused
            try:
                seq = await client.say("During the famine.", voice="en-espeak")
                await client.wait_for(lambda g: any(e.get("seq") == seq for e in g.of("error")), 15)
                error = next(e for e in client.got.of("error") if e.get("seq") == seq)
                assert error["code"] == "unavailable" and error["retry_after_ms"] > 0
                await asyncio.sleep(2)  # a few seconds of it: loops back off, nothing dies
                assert client.closed is None, "the socket stays open"
            finally:
                admin.config_set("maxmemory", 0)
            await client.say("During the famine.", voice="en-espeak", seq=seq)  # the same line, resent
            await client.wait_for(lambda g: any(a["seq"] == seq for a in g.of("accepted")), 15)
            ends = await client.wait_ends(2, timeout=40)
            assert ends[1]["status"] == "ok" and len(client.got.frames_of(ends[1]["utterance"])) > 5
            assert client.closed is None
        log = gateway.log_text()
        assert "Exception in ASGI application" not in log and "Traceback" not in log, log[-3000:]
    finally:
        admin.config_set("maxmemory", 0)
        admin.close()
        gateway.stop()
        worker.stop()
