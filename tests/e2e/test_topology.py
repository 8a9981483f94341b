"""Several gateways and several workers on one Redis serve the same rooms."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from tests.support.waiting import until
from voxroom.store.server import RedisServer


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


async def test_clients_on_two_gateways_hear_the_same_room_from_two_workers(own_redis: RedisServer,
                                                                          tmp_path: Path) -> None:
    workers = [start_worker(own_redis.url, tmp_path, engine="offline", contexts=1, name=f"w{i}") for i in range(2)]
    gateways = [start_gateway(own_redis.url, tmp_path) for _ in range(2)]
    try:
        (_, port_a), (_, port_b) = gateways
        async with RoomClient(port_a, "village") as a, RoomClient(port_b, "village") as b:
            lines = [f"Player {n} speaks now." for n in range(1, 7)]
            for i, line in enumerate(lines):
                speaker = a if i % 2 == 0 else b
                await speaker.say(line, voice="en-espeak" if i % 3 else "en-joe")
                # Two sockets race to the Redis script; wait for the seq so the expected order is known.
                await speaker.wait_for(lambda g, n=i // 2 + 1: len(g.of("accepted")) >= n, 10)
            await a.wait_ends(6, timeout=60)
            await b.wait_ends(6, timeout=60)
        for client in (a, b):
            assert [e["utterance"] for e in client.got.ends()] == [1, 2, 3, 4, 5, 6]
            assert [s["text"] for s in client.got.of("start")] == lines
        assert [(f.seq, f.chunk, f.pts_us) for f in a.got.frames] == \
               [(f.seq, f.chunk, f.pts_us) for f in b.got.frames]
        # Both workers took part: each logged utterances it published (a worker logs a line after
        # its `end` went out, so the last log line may come after the clients saw the end).
        def published() -> list[int]:
            return [w.log_text().count(" ok: ") for w in workers]
        await until(lambda: sum(published()) >= 6, lambda: f"six lines logged as published: {published()}", timeout=30)
        assert sum(published()) == 6
        assert all(n > 0 for n in published()), f"one worker did nothing: {published()}"
    finally:
        for proc, _ in gateways:
            proc.stop()
        for w in workers:
            w.stop()
