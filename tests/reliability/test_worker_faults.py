"""Worker faults over real processes: ``voxroom worker`` processes against a real redis-server,
SIGKILLed, SIGSTOPped, starved of memory, or put behind a Redis that answers ``-LOADING``.

What the worker writes is judged from the rooms' output streams, which is what every listener of
every gateway receives: every accepted line ends once, in order, its final take whole, nothing of
it after its ``end`` (``tests/support/outputs.py``). The audio cache is off: with cache hits the
contexts empty at once and intake races are not exercised. The engine is the synthetic one, whose
lines are as long as their text says (about 14 characters a second) and cost no CPU.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from pathlib import Path

import hiredis
from redis.asyncio import Redis

from tests.support.outputs import add_jobs, problems, read_out, wait_ends
from tests.support.processes import Proc, start_worker
from voxroom.store import keys
from voxroom.store.server import RedisServer

LINE = "A line of about forty characters, spoken."  # about 3 s of audio
LONG_LINE = LINE + " " + LINE + " " + LINE  # about 9 s
FAST = {"VOXROOM_CACHE_SLOTS": "0", "VOXROOM_CLAIM_IDLE_MS": "1500", "VOXROOM_OPUS_BITRATE": "0",
        "VOXROOM_SYNTHETIC_TTFC_MS": "30"}




def worker(url: str, logs: Path, name: str, **env: str) -> Proc:
    return start_worker(url, logs, engine="synthetic", contexts=1, name=name, **{**FAST, **env})


async def chunks_of(raw: Redis, room: str, seq: int) -> int:
    return sum(1 for e in await read_out(raw, room) if e.kind == "chunk" and e.seq == seq)


async def wait_chunks(raw: Redis, room: str, seq: int, n: int, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while await chunks_of(raw, room, seq) < n:
        assert time.monotonic() < deadline, f"room {room} line {seq}: fewer than {n} chunks"
        await asyncio.sleep(0.05)


async def heartbeat(r: Redis) -> dict[str, str]:
    """The one worker's heartbeat hash ({} once it expired)."""
    found = await r.keys(keys.worker_pattern())
    assert len(found) <= 1, found
    return await r.hgetall(found[0]) if found else {}


async def wait_heartbeat_after(r: Redis, since_ms: int, timeout: float = 15.0) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while True:
        beat = await heartbeat(r)
        if int(beat.get("time_ms", 0)) > since_ms:
            return beat
        assert time.monotonic() < deadline, f"no heartbeat since the fault ended: {beat}"
        await asyncio.sleep(0.2)


def no_loop_failed(proc: Proc) -> None:
    text = proc.log_text()
    assert " failed (restart" not in text and "Traceback" not in text, text[-3000:]


async def test_a_worker_restarted_with_lines_in_flight_loses_and_doubles_nothing(
        own_redis: RedisServer, r: Redis, raw: Redis, tmp_path: Path) -> None:
    # A rolling deploy: the worker is SIGKILLed with lines playing, queued and unread in four
    # rooms; its heir claims the stale ones while new lines keep coming. Its pool is small, so
    # the claims fill it while its read waits (before: Overloaded, the reader died, rooms stalled).
    rooms = [f"roll-{i}" for i in range(4)]
    doomed = worker(own_redis.url, tmp_path, "doomed", VOXROOM_CONTEXT_INFLIGHT="4", VOXROOM_CONTEXT_QUEUE="8")
    heir: Proc | None = None
    try:
        await add_jobs(r, [(room, LINE) for room in rooms] + [(room, "A second line.") for room in rooms])
        for room in rooms[:2]:
            await wait_chunks(raw, room, 1, 10)
        doomed.kill()
        heir = worker(own_redis.url, tmp_path, "heir", VOXROOM_CONTEXT_INFLIGHT="2", VOXROOM_CONTEXT_QUEUE="1")
        await asyncio.sleep(2.5)  # past the claim time: the heir's pool is full of claimed lines
        await add_jobs(r, [(room, "A third line.") for room in rooms])
        got = await wait_ends(raw, {room: 3 for room in rooms}, 90)
        for room in rooms:
            assert problems(got[room], 3) == [], room
        assert (await r.xpending(keys.JOBS, keys.JOBS_GROUP))["pending"] == 0
        assert "claimed room roll-0 utterance 1" in heir.log_text()
        no_loop_failed(heir)
    finally:
        for proc in (doomed, heir):
            if proc is not None:
                proc.stop()


async def test_a_worker_paused_past_the_claim_time_writes_nothing_more(
        own_redis: RedisServer, r: Redis, raw: Redis, tmp_path: Path) -> None:
    # SIGSTOP the worker holding a line mid-line for longer than the claim time: the other worker
    # takes the line over and plays it again from its start. On SIGCONT the paused one finds
    # its writes refused by Redis and drops the line: no chunk of its old take after the new one
    # began, no second end, and it does not take the line back.
    # A claim time of 4 s, not 1.5: the new holder refreshes its claim every third of it, and a
    # busy machine must not stall it long enough for the resumed one to take the line back.
    first = worker(own_redis.url, tmp_path, "first", VOXROOM_CLAIM_IDLE_MS="4000")
    second = worker(own_redis.url, tmp_path, "second", VOXROOM_CLAIM_IDLE_MS="4000")
    paused: Proc | None = None
    try:
        await add_jobs(r, [("pause", LONG_LINE)])
        await wait_chunks(raw, "pause", 1, 10)
        pending = await r.xpending_range(keys.JOBS, keys.JOBS_GROUP, min="-", max="+", count=1)
        holder_pid = int(pending[0]["consumer"].rsplit("-", 2)[1])
        paused = first if first.pid == holder_pid else second
        os.kill(paused.pid, signal.SIGSTOP)
        try:
            # The claim time (4 s) and a claim pass (every 2 s) later, the other worker restarts it.
            deadline = time.monotonic() + 40
            while not any(e.restart for e in await read_out(raw, "pause")):
                assert time.monotonic() < deadline, "the line was not taken over"
                await asyncio.sleep(0.1)
            await asyncio.sleep(1.0)
        finally:
            os.kill(paused.pid, signal.SIGCONT)
        await add_jobs(r, [("pause", "A later line.")])
        got = await wait_ends(raw, {"pause": 2}, 60)
        assert problems(got["pause"], 2) == []
        assert sum(1 for e in got["pause"] if e.kind == "start" and e.seq == 1) == 2, "one take each"
        assert (await r.xpending(keys.JOBS, keys.JOBS_GROUP))["pending"] == 0
        deadline = time.monotonic() + 30
        while "is another worker's now; dropped" not in paused.log_text():
            assert time.monotonic() < deadline, paused.log_text()[-2000:]
            await asyncio.sleep(0.1)
        assert paused.alive()
    finally:
        for proc in (first, second):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signal.SIGCONT)
            proc.stop()


async def test_redis_out_of_memory_for_seconds_then_the_worker_speaks_again(
        own_redis: RedisServer, r: Redis, raw: Redis, tmp_path: Path) -> None:
    proc = worker(own_redis.url, tmp_path, "oom")
    try:
        await add_jobs(r, [("oom", "Before.")])
        await wait_ends(raw, {"oom": 1}, 20)
        await add_jobs(r, [("oom", LONG_LINE)])
        await wait_chunks(raw, "oom", 2, 5)
        used = int((await r.info("memory"))["used_memory"])
        await r.config_set("maxmemory-policy", "noeviction")
        await r.config_set("maxmemory", str(used // 2))  # every write that needs memory is refused
        try:
            await asyncio.sleep(4.5)  # two heartbeats, slices and claim refreshes all refused
        finally:
            await r.config_set("maxmemory", "0")
        restored_ms = int(time.time() * 1000)
        await add_jobs(r, [("oom", "After.")])
        # The line cut by the outage is claimed again and played whole; the next one plays.
        got = await wait_ends(raw, {"oom": 3}, 60)
        assert problems(got["oom"], 3) == []
        beat = await wait_heartbeat_after(r, restored_ms)
        assert beat["loops_down"] == "" and beat["loop_restarts"] == "0", beat
        assert await r.zcount(keys.WORKERS, restored_ms, "+inf") == 1, "registered again after the outage"
        assert "heartbeat not written" in proc.log_text(), "the outage was seen"
        no_loop_failed(proc)
    finally:
        proc.stop()


class LoadingProxy:
    """A TCP proxy in front of a real Redis. :meth:`loading` drops every connection (a restart)
    and, until :meth:`loaded`, answers every command with ``-LOADING``, as a Redis reading a large
    append-only file does; after that, connections pass through."""

    REPLY = b"-LOADING Redis is loading the dataset in memory\r\n"

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.is_loading = False
        self.refused = 0
        self._writers: set[asyncio.StreamWriter] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._server: asyncio.Server | None = None
        self.port = 0

    async def start(self) -> LoadingProxy:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def loading(self) -> None:
        self.is_loading = True
        for writer in list(self._writers):
            writer.close()

    def loaded(self) -> None:
        self.is_loading = False

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self._writers.add(writer)
        parser = hiredis.Reader()
        upstream: asyncio.StreamWriter | None = None
        pump: asyncio.Task[None] | None = None
        try:
            while data := await reader.read(65536):
                parser.feed(data)
                while (command := parser.gets()) is not False:
                    if upstream is None and self.is_loading:
                        self.refused += 1
                        writer.write(self.REPLY)
                        continue
                    if upstream is None:
                        up_reader, upstream = await asyncio.open_connection("127.0.0.1", self.upstream_port)
                        self._writers.add(upstream)
                        pump = asyncio.create_task(self._pump(up_reader, writer))
                    upstream.write(hiredis.pack_command(tuple(command)))
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for w in (writer, upstream):
                if w is not None:
                    w.close()
                    self._writers.discard(w)
            if pump is not None:
                pump.cancel()
                await asyncio.gather(pump, return_exceptions=True)
            self._tasks.discard(task)

    @staticmethod
    async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                writer.write(data)
        writer.close()

    async def aclose(self) -> None:
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._server is not None:
            await self._server.wait_closed()


async def test_redis_loading_its_data_then_the_worker_speaks_again(
        own_redis: RedisServer, r: Redis, raw: Redis, tmp_path: Path) -> None:
    proxy = await LoadingProxy(own_redis.port).start()
    proc: Proc | None = None
    try:
        # start_worker waits by polling: off the loop, which serves the proxy meanwhile.
        proc = await asyncio.to_thread(worker, proxy.url, tmp_path, "loading")
        await add_jobs(r, [("load", "Before.")])
        await wait_ends(raw, {"load": 1}, 20)
        proxy.loading()
        await asyncio.sleep(4.0)
        proxy.loaded()
        restored_ms = int(time.time() * 1000)
        assert proxy.refused > 0, "the worker tried Redis while it was loading"
        await add_jobs(r, [("load", "After.")])
        got = await wait_ends(raw, {"load": 2}, 40)
        assert problems(got["load"], 2) == []
        beat = await wait_heartbeat_after(r, restored_ms)
        assert beat["loops_down"] == "" and beat["loop_restarts"] == "0", beat
        no_loop_failed(proc)
    finally:
        if proc is not None:
            proc.stop()
        await proxy.aclose()


async def test_composes_batch_of_eight_with_two_in_flight_plays_every_line(
        own_redis: RedisServer, r: Redis, raw: Redis, tmp_path: Path) -> None:
    # An in-flight bound below the engine's batch (2 against 8; docker-compose.yml shipped 2 once).
    proc = worker(own_redis.url, tmp_path, "batch", VOXROOM_SYNTHETIC_MAX_BATCH="8",
                  VOXROOM_CONTEXT_INFLIGHT="2")
    try:
        rooms = [f"batch-{i}" for i in range(3)]
        await add_jobs(r, [(room, "Three lines at once.") for room in rooms])  # one round trip
        got = await wait_ends(raw, {room: 1 for room in rooms}, 30)
        for room in rooms:
            assert problems(got[room], 1) == [], room
    finally:
        proc.stop()
