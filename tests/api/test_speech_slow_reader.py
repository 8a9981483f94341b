"""A slow reader gets every byte of a long response (tests/api/slow_reader.py), one Redis."""

from __future__ import annotations

from pathlib import Path

from redis.asyncio import Redis

from tests.api.slow_reader import PCM_BYTES_PER_S, WORKER_ENV, read_slowly
from tests.support.processes import start_gateway, start_worker
from voxroom.store import keys
from voxroom.store.server import RedisServer


async def test_a_slow_reader_gets_every_byte_and_its_room_holds_only_what_it_has_not_read(tmp_path: Path) -> None:
    """Read at 12 times real time while the worker writes at 100 times: the body is the fast
    reader's, byte for byte, and the private room's stream never held the whole response (the
    gateway trims what it sent; it holds what is left of the line being read and the few said
    ahead). Before, the worker trimmed the unread lines to its window: a shorter body, properly
    terminated."""
    with RedisServer() as server:
        worker = start_worker(server.url, tmp_path, engine="synthetic", contexts=2, **WORKER_ENV)
        gateway, port = start_gateway(server.url, tmp_path)
        redis = Redis.from_url(server.url)

        async def stream_length() -> int:
            names = [k async for k in redis.scan_iter(match=keys.room_output(keys.PRIVATE_ROOM_PREFIX + "*"))]
            return sum([await redis.xlen(k) for k in names])

        try:
            fast, slow, most = await read_slowly(port, stream_length)
        finally:
            await redis.aclose()
            gateway.stop()
            worker.stop()
    assert fast.complete and len(fast.body) > 200 * PCM_BYTES_PER_S, "several minutes of audio"
    assert slow.complete, slow.ended
    assert len(slow.body) == len(fast.body), f"{(len(fast.body) - len(slow.body)) / PCM_BYTES_PER_S:.1f} s missing"
    assert bytes(slow.body) == bytes(fast.body)
    entries = len(fast.body) // 1920  # one 40 ms slice an entry
    assert 0 < most < 0.75 * entries, (most, entries)
