"""A room's output stream costs at most 1.2x the PCM it keeps, in the Redis voxroom starts and ships.

With Redis's default ``stream-node-max-bytes`` (4096) every two-slice entry took a node of its own
(a listpack just over 4 KiB, rounded up by the allocator, repeating the field names): ``MEMORY USAGE``
of a room's ``:out`` was 1.27x its PCM, 1.53x with Opus copies. ``voxroom/store/redis_config.py`` sets
64 KiB nodes. Here a real synthetic worker speaks into real rooms with a PCM and an Opus listener,
and the stream is weighed against the slices it holds; then the places that configure Redis are
checked to say the same.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from typing import Any

import yaml
from redis.asyncio import Redis

from tests.ops.conftest import OpsStack
from tests.support.processes import ROOT
from tests.support.room_client import RoomClient
from voxroom.store import keys
from voxroom.wire.protocol import ROOM_RATE
from voxroom.store.redis_config import SERVER_ARGS, STREAM_NODE_MAX_BYTES

PCM_PER_SLICE = ROOM_RATE * 40 // 1000 * 2
LIMIT = 1.2


async def weigh(url: str, room: str) -> tuple[int, int, int]:
    """MEMORY USAGE of the room's output stream, the slices it holds, the bytes of their Opus copies."""
    raw = Redis.from_url(url)
    try:
        usage = int(await raw.memory_usage(keys.room_output(room), samples=0) or 0)
        entries: Any = await raw.xrange(keys.room_output(room))
    finally:
        await raw.aclose()
    chunks = [f for _, f in entries if f.get(b"kind") == b"chunk"]
    slices = sum(int(f.get(b"slices", 1)) for f in chunks)
    opus = sum(len(v) for f in chunks for k, v in f.items() if k.startswith(b"opus"))
    return usage, slices, opus


async def speak(port: int, room: str, codec: str) -> None:
    client = RoomClient(port, room)
    if codec != "pcm16":
        client.url += f"?codec={codec}"
    async with client:
        # About 10 s of the synthetic engine's audio, unique text (no cache hit).
        await client.say(f"{room}: " + "the band plays on while the village sleeps and waits " * 3)
        (end,) = await client.wait_ends(1, timeout=120)
        assert end["status"] == "ok", end


async def test_a_room_s_stream_costs_at_most_1_2x_the_pcm_it_keeps(ops_stack: OpsStack) -> None:
    rooms = {codec: f"mem-{codec}-{uuid.uuid4().hex[:8]}" for codec in ("pcm16", "opus")}
    await asyncio.gather(*(speak(ops_stack.port, room, codec) for codec, room in rooms.items()))
    for codec, room in rooms.items():
        usage, slices, opus = await weigh(ops_stack.redis_url, room)
        assert slices > 200, f"{codec}: {slices} slices"
        assert (opus > 0) == (codec == "opus"), f"{codec}: {opus} bytes of Opus copies"
        ratio = usage / (slices * PCM_PER_SLICE)
        assert ratio <= LIMIT, f"{codec}: MEMORY USAGE {usage} B for {slices} slices: {ratio:.3f}x the PCM"
    r = Redis.from_url(ops_stack.redis_url, decode_responses=True)
    try:
        config = await r.config_get("stream-node-max-bytes")
    finally:
        await r.aclose()
    assert int(config["stream-node-max-bytes"]) == STREAM_NODE_MAX_BYTES, "the Redis voxroom started"


def test_every_place_that_configures_redis_sets_the_stream_node_size() -> None:
    services = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    command = [str(word) for word in services["redis"]["command"]]
    assert all(arg in command for arg in SERVER_ARGS) and \
        command[command.index(SERVER_ARGS[0]) + 1] == SERVER_ARGS[1], command
    operations = (ROOT / "docs" / "operations.md").read_text()
    assert re.search(rf"stream-node-max-bytes {STREAM_NODE_MAX_BYTES}\b", operations)
