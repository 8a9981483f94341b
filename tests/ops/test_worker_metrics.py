"""A worker's own ``/metrics`` over real processes: a real worker, gateway and redis-server; lines
spoken in a real room move the worker's time-to-first-audio histograms, and the gateway no longer
re-exports worker series from heartbeats."""

from __future__ import annotations

import asyncio
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store import keys
from voxroom.store.server import RedisServer, free_port
from workers.intake.metrics import STAGES

LINES = 3


@dataclass
class WorkerStack:
    redis_url: str
    worker: Proc
    metrics_port: int
    gateway_port: int


@pytest.fixture(scope="module")
def worker_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerStack]:
    """Its own Redis: the synthetic worker speaks every voice and would take other tests' lines."""
    logs: Path = tmp_path_factory.mktemp("worker-metrics")
    metrics_port = free_port()
    with RedisServer() as redis:
        worker = start_worker(redis.url, logs, engine="synthetic", contexts=2,
                              VOXROOM_WORKER_METRICS_PORT=str(metrics_port))
        try:
            gateway, gateway_port = start_gateway(redis.url, logs)
            try:
                yield WorkerStack(redis.url, worker, metrics_port, gateway_port)
            finally:
                gateway.stop()
        finally:
            worker.stop()


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int, path: str = "/metrics") -> Samples:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = resp.read().decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of ``name`` over every label set that contains ``labels``."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= ls)


def names(samples: Samples) -> set[str]:
    return {n for n, _ in samples}


async def heartbeat(redis_url: str) -> dict[str, str]:
    redis = Redis.from_url(redis_url, decode_responses=True)
    try:
        async for key in redis.scan_iter(match=keys.worker_pattern()):
            return {str(k): str(v) for k, v in (await redis.hgetall(key)).items()}
    finally:
        await redis.aclose()
    raise AssertionError("no worker heartbeat")


async def test_lines_spoken_in_a_room_fill_the_workers_first_audio_histograms(
        worker_stack: WorkerStack, room: str) -> None:
    port = worker_stack.metrics_port
    before = await asyncio.to_thread(scrape, port)
    async with RoomClient(worker_stack.gateway_port, room) as client:
        for n in range(LINES):
            await client.say(f"worker metrics line number {n + 1}, spoken in a real room")
        ends = await client.wait_ends(LINES)
    assert [e["status"] for e in ends] == ["ok"] * LINES
    received_s = sum(f.samples for f in client.got.frames) / client.got.frames[0].sample_rate

    # The worker counts a line just after writing its end entry: the client may see the end first.
    deadline = time.monotonic() + 10
    while True:
        after = await asyncio.to_thread(scrape, port)
        done = total(after, "voxroom_worker_utterances_total", engine="synthetic", status="ok") - \
            total(before, "voxroom_worker_utterances_total", engine="synthetic", status="ok")
        if done >= LINES or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.1)
    assert done == LINES

    def delta(name: str, **labels: str) -> float:
        return total(after, name, engine="synthetic", **labels) - total(before, name, engine="synthetic", **labels)

    assert delta("voxroom_worker_time_to_first_audio_seconds_count", source="engine") == LINES
    assert delta("voxroom_worker_time_to_first_audio_seconds_sum", source="engine") > 0
    # Every line reached its first slice in the 10 s bucket's range, so +Inf and 10 s agree.
    assert delta("voxroom_worker_time_to_first_audio_seconds_bucket", le="10.0") == LINES
    stage_sums = {}
    for stage in STAGES:
        assert delta("voxroom_worker_first_audio_stage_seconds_count", stage=stage) == LINES, stage
        stage_sums[stage] = delta("voxroom_worker_first_audio_stage_seconds_sum", stage=stage)
        assert stage_sums[stage] >= 0, stage
    # The synthetic engine takes 50 ms to its first chunk: that stage is never empty.
    assert stage_sums["engine_first_chunk"] > 0
    assert sum(stage_sums.values()) > 0
    # Published audio seconds are the audio the room received (40 ms slices, the last one shorter).
    assert delta("voxroom_worker_audio_seconds_total") == pytest.approx(received_s, abs=0.001 * LINES)

    contexts = {dict(ls)["context"]: v for (n, ls), v in after.items()
                if n == "voxroom_context_audio_seconds_total" and ("engines", "synthetic") in ls}
    assert len(contexts) == 2
    assert sum(contexts.values()) - total(before, "voxroom_context_audio_seconds_total") > 0
    assert {"voxroom_context_queue", "voxroom_context_active", "voxroom_context_rtf"} <= names(after)
    assert total(after, "voxroom_loop_up", process="worker", loop="intake") == 1
    assert total(after, "process_resident_memory_bytes") > 0

    beat = await heartbeat(worker_stack.redis_url)
    assert beat["metrics_port"] == str(port)  # where to scrape it, for discovery from Redis
    worker_id = next(dict(ls)["worker"] for n, ls in after if n == "voxroom_worker_info")
    assert total(after, "voxroom_worker_info", worker=worker_id, engines="synthetic") == 1
    assert total(after, "voxroom_worker_published_total") >= LINES


async def test_the_gateway_exports_only_what_it_sees_of_the_workers(worker_stack: WorkerStack) -> None:
    gateway = await asyncio.to_thread(scrape, worker_stack.gateway_port)
    assert total(gateway, "voxroom_workers_alive") == 1
    reexported = {n for n in names(gateway) if n.startswith(("voxroom_worker_", "voxroom_context_", "voxroom_cache_"))}
    assert not reexported, f"a gateway re-exports worker series: {sorted(reexported)}"


async def test_the_worker_answers_only_metrics(worker_stack: WorkerStack) -> None:
    with pytest.raises(urllib.error.HTTPError) as caught:
        await asyncio.to_thread(scrape, worker_stack.metrics_port, "/admin")
    caught.value.close()  # it holds the response's socket
    assert caught.value.code == 404
