"""Network partitions (issue 32): a gateway, then a worker, cut off from Redis while rooms speak,
the process alive, its packets to Redis dropped both ways inside a network namespace of the test's
own (tests/support/netns.py). What a listener receives is asserted (every line whole, once, in
order); how long the recovery took is bench/partitions.py's to measure."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import netns
from tests.support.heard import assert_heard_whole_once_in_order
from tests.support.processes import base_env, start_gateway, start_worker, wait_http
from tests.support.room_client import RoomClient
from tests.support.waiting import scaled, until
from voxroom.store.server import RedisServer, free_port

UNAVAILABLE = netns.unavailable()
pytestmark = pytest.mark.skipif(UNAVAILABLE is not None, reason=f"network partitions: {UNAVAILABLE}")

VOICE = "en-espeak"
LINES = ["The night falls over the village, and everyone closes their eyes.",
         "The wolves wake, look at one another, and choose a victim in silence.",
         "The seer wakes and points at a player whose card she wants to see."]
CUT_S = 6.0
"""Longer than a blocked read's deadline (its 2 s block and a second), shorter than the lines."""


@pytest.fixture
def ns() -> Iterator[netns.Namespace]:
    with netns.Namespace() as made:
        yield made


@pytest.fixture
def redis_both(ns: netns.Namespace) -> Iterator[RedisServer]:
    """A Redis on 127.0.0.1 and on this side of the namespace's veth."""
    with RedisServer(also_bind=(ns.host_ip,)) as server:
        yield server


def _in_ns_url(ns: netns.Namespace, server: RedisServer) -> str:
    return f"redis://{ns.host_ip}:{server.port}/0"


def _status(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=3) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


async def test_listeners_of_a_gateway_cut_off_from_redis_hear_every_line_whole(
        ns: netns.Namespace, redis_both: RedisServer, tmp_path: Path) -> None:
    """Six rooms speak through a gateway whose Redis traffic is dropped for 6 s mid-line. Before, its
    listeners got no error, then one burst at the heal holding only the backlog's tail (16 of 16
    lines with most slices missing). Now each listener is replayed what it missed at its own pace,
    then live: every line whole, once, in order. /readyz answers 503 during the cut."""
    worker = start_worker(redis_both.url, tmp_path, contexts=2)
    port = free_port()
    gateway = ns.start([sys.executable, "-m", "voxroom_cli", "gateway", "--host", ns.ip, "--port", str(port),
                        "--insecure-dev"], base_env(_in_ns_url(ns, redis_both)), tmp_path / "gateway-ns.log")
    rooms = [f"cut-{i}" for i in range(6)]
    try:
        wait_http(f"http://{ns.ip}:{port}/healthz", proc=gateway)
        await until(lambda: _status(f"http://{ns.ip}:{port}/readyz")[0] == 200, "the gateway ready", timeout=30)
        async with contextlib.AsyncExitStack() as stack:
            listeners = [await stack.enter_async_context(RoomClient(port, room, host=ns.ip)) for room in rooms]
            speakers = [await stack.enter_async_context(RoomClient(port, room, host=ns.ip)) for room in rooms]
            for speaker in speakers:
                for line in LINES:
                    await speaker.say(line, voice=VOICE)
            await asyncio.gather(*(s.wait_for(lambda g: len(g.of("accepted")) == len(LINES), 30) for s in speakers))
            # Every room's first line under way, then the cut.
            await asyncio.gather(*(c.wait_for(lambda g: len(g.frames) >= 5, 60) for c in listeners))
            ns.cut(redis_both.port)
            cut_at = time.monotonic()
            refused = await asyncio.to_thread(_status, f"http://{ns.ip}:{port}/readyz")
            while time.monotonic() - cut_at < CUT_S:  # the cut lasts; /readyz keeps answering
                refused = await asyncio.to_thread(_status, f"http://{ns.ip}:{port}/readyz")
                await asyncio.sleep(0.5)
            ns.heal()
            await asyncio.gather(*(c.wait_ends(len(LINES), timeout=90) for c in listeners))
            await asyncio.sleep(0.5)  # anything sent twice would have arrived by now
        for client in listeners:
            assert_heard_whole_once_in_order(client.got, len(LINES))
        assert refused[0] == 503 and "redis unreachable" in refused[1], refused
        log = gateway.log_text()
        assert log.count("redis unreachable from this gateway") == 1, log[-4000:]
        assert log.count("redis reachable again after") == 1, log[-4000:]
        metrics = _status(f"http://{ns.ip}:{port}/metrics")[1]
        assert "voxroom_redis_cutoffs_total 1.0" in metrics
        assert "Traceback" not in log, log[-4000:]
    finally:
        with contextlib.suppress(Exception):
            ns.heal()
        gateway.stop()
        worker.stop()


async def test_a_worker_cut_off_from_redis_takes_the_next_line_after_the_heal(
        ns: netns.Namespace, redis_both: RedisServer, tmp_path: Path) -> None:
    """A worker's blocked job read on a connection whose packets are dropped: before, it waited
    out a 30 s reply timeout (the first job after a 15 s cut came 13 s after the heal). Its reads
    now have a deadline a dead connection cannot outlive: the line said during the cut is spoken
    once the cut heals, whole, by that worker."""
    gateway, port = start_gateway(redis_both.url, tmp_path)
    metrics_port = free_port()
    worker = ns.start([sys.executable, "-m", "voxroom_cli", "worker", "--engine", "offline", "--contexts", "1"],
                      base_env(_in_ns_url(ns, redis_both), VOXROOM_WORKER_METRICS_PORT=str(metrics_port)),
                      tmp_path / "worker-ns.log")
    try:
        await until(lambda: "ready:" in worker.log_text() or not worker.alive(), "the worker ready", timeout=60)
        assert worker.alive(), worker.log_text()[-3000:]
        async with RoomClient(port, "healed") as client:
            await client.say(LINES[0], voice=VOICE)
            await client.wait_ends(1, timeout=30)
            ns.cut(redis_both.port)
            await asyncio.sleep(1.0)  # the worker is blocked on a read the cut will never answer
            await client.say(LINES[1], voice=VOICE)  # the gateway still reaches Redis: stored
            await client.wait_for(lambda g: len(g.of("accepted")) == 2, 15)
            await asyncio.sleep(CUT_S - 1.0)
            assert len(client.got.ends()) == 1, "nothing can speak the line during the cut"
            ns.heal()
            await client.wait_ends(2, timeout=scaled(30))
        assert_heard_whole_once_in_order(client.got, 2)
        assert worker.alive()
    finally:
        with contextlib.suppress(Exception):
            ns.heal()
        worker.stop()
        gateway.stop()
