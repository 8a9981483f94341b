"""The audio cache over real processes: a repeated line is published from Redis, not synthesized."""

from __future__ import annotations

import asyncio
import random
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from tests.conftest import Stack
from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from tests.support.waiting import scaled
from voxroom.store import keys
from voxroom.store.server import RedisServer


async def heartbeat_after(redis: Redis, after_ms: float, timeout: float = 8.0) -> dict[str, str]:
    """The (only) worker's heartbeat, once it was written after ``after_ms``."""
    deadline = time.monotonic() + timeout
    while True:
        async for key in redis.scan_iter(match=keys.worker_pattern()):
            beat: dict[str, str] = await redis.hgetall(key)
            if float(beat.get("time_ms", 0)) > after_ms:
                return beat
        assert time.monotonic() < deadline, "no fresh worker heartbeat"
        await asyncio.sleep(0.2)


def synthesized_seconds(beat: dict[str, str]) -> float:
    return sum(float(v) for k, v in beat.items() if k.startswith("ctx.") and k.endswith(".audio_s"))


async def test_a_repeated_line_is_served_from_the_cache_identical_and_without_the_engine(
        stack: Stack, room: str) -> None:
    text = f"The seer opens her eyes {random.randint(1000, 9999)} times and looks around the village."
    redis = Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        async with RoomClient(stack.port, room) as client:
            await client.say(text, voice="en-espeak")
            await client.wait_ends(1)
            first = await heartbeat_after(redis, time.time() * 1000)
            await client.say(text, voice="en-espeak")
            await client.wait_ends(2)
            second = await heartbeat_after(redis, time.time() * 1000)
    finally:
        await redis.aclose()
    assert [e["status"] for e in client.got.ends()] == ["ok", "ok"]
    one, two = client.got.frames_of(1), client.got.frames_of(2)
    assert len(one) == len(two) > 20
    assert [f.payload for f in one] == [f.payload for f in two], "cached audio must be the same samples"
    assert [(f.chunk, f.first, f.last) for f in one] == [(f.chunk, f.first, f.last) for f in two]
    assert two[0].pts_us >= one[-1].pts_us  # same room order and pacing as fresh audio
    assert int(second["cache.hits"]) == int(first["cache.hits"]) + 1
    assert int(second["cache.misses"]) == int(first["cache.misses"])
    assert int(second["cache.bytes_served"]) - int(first["cache.bytes_served"]) == \
           sum(len(f.payload) for f in two)
    # The engine did not run: no context synthesized any more audio.
    assert synthesized_seconds(second) == synthesized_seconds(first)


async def test_hits_and_bytes_are_in_the_workers_metrics(stack: Stack, room: str) -> None:
    """On the worker's own ``/metrics`` (workers/intake/metrics.py), found through its heartbeat."""
    text = f"The hunter takes aim {random.randint(1000, 9999)} times."
    async with RoomClient(stack.port, room) as client:
        for _ in range(2):
            await client.say(text, voice="en-espeak")
        await client.wait_ends(2)
    redis = Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        beats = [await redis.hgetall(key) async for key in redis.scan_iter(match=keys.worker_pattern())]
    finally:
        await redis.aclose()
    port = next(int(b["metrics_port"]) for b in beats if b.get("pid") == str(stack.worker.pid))
    deadline = time.monotonic() + scaled(30)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
        while True:
            families = {f.name: f for f in text_string_to_metric_families((await http.get("/metrics")).text)}
            hits = sum(s.value for s in families["voxroom_cache_hits"].samples) if "voxroom_cache_hits" in families \
                else 0
            if hits >= 1 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.3)
    assert hits >= 1
    assert families["voxroom_cache_misses"].type == "counter"
    assert sum(s.value for s in families["voxroom_cache_served_bytes"].samples) > 0


CONTINUOUS_TTFC_MS = 3000


async def test_a_continuous_engine_repeats_a_line_from_the_cache_without_waiting_for_it(tmp_path: Path) -> None:
    """Over real processes, with a continuous-batching engine (which starts every line at once
    and looks it up beside): the repeat is the same samples, and it comes before the engine's
    first chunk was due, which the first take waited for. The engine's time to first chunk is
    long (3 s) so that the order holds on a busy machine: the repeat's path through gateway,
    Redis and worker is measured in benchmarks, not bounded here."""
    with RedisServer() as redis:
        worker = start_worker(redis.url, tmp_path, engine="synthetic", contexts=1,
                              VOXROOM_SYNTHETIC_CONTINUOUS="1", VOXROOM_SYNTHETIC_MAX_BATCH="8",
                              VOXROOM_SYNTHETIC_TTFC_MS=str(CONTINUOUS_TTFC_MS), VOXROOM_CONTEXT_INFLIGHT="8")
        gateway, port = start_gateway(redis.url, tmp_path)
        try:
            text = f"The mayor counts the votes {random.randint(1000, 9999)} times."
            async with RoomClient(port, "cache-continuous") as client:
                said = []
                for n in (1, 2):
                    said.append(time.time() * 1000)
                    await client.say(text, voice="en-espeak")
                    await client.wait_ends(n)
            assert [e["status"] for e in client.got.ends()] == ["ok", "ok"]
            one, two = client.got.frames_of(1), client.got.frames_of(2)
            assert len(one) == len(two) > 20
            assert [f.payload for f in one] == [f.payload for f in two], "the repeat is the cached samples"
            first_audio = [client.got.frame_times[client.got.frames.index(frames[0])] - t
                           for frames, t in ((one, said[0]), (two, said[1]))]
            assert first_audio[0] >= CONTINUOUS_TTFC_MS, first_audio
            assert first_audio[1] < CONTINUOUS_TTFC_MS, f"a hit waits for no engine's first chunk: {first_audio}"
        finally:
            gateway.stop()
            worker.stop()
