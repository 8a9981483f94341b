"""Paced slices after an utterance's first travel several to one output entry
(voxroom/wire/output_entries.py, workers/output/publisher.py); clients still get one frame per slice, in order,
live and on resume, a resume in the middle of a group included. Bytes in, frames out; then the
real publisher against a real redis-server; then a real gateway replaying grouped entries."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from redis.asyncio import Redis

from app.fanout.entries import client_items, entry_items
from app.fanout.resume import ResumePoint, held_slices, stop_here
from tests.support.processes import start_gateway
from tests.support.room_client import RoomClient
from tests.support.stores import Stores
from voxroom.store import clients as redis_client
from voxroom.store import keys
from voxroom.store.jobs import FencedJobBus
from voxroom.store.server import RedisServer
from voxroom.wire.jobs import Job
from voxroom.wire.output_entries import (
    MAX_GROUP,
    EntryFields,
    chunk_fields,
    entry_fields,
    group_fields,
    slice_frames,
)
from voxroom.wire.protocol import (
    CODEC_OPUS,
    CODEC_PCM16,
    ROOM_RATE,
    SLICE_SAMPLES,
    AudioFrame,
    end_message,
    start_message,
)
from workers.output.clock import RoomClock
from workers.output.publisher import PACED_GROUP, publish_utterance
from workers.utterance import SliceBuffer, Utterance


def as_redis_returns(fields: EntryFields) -> dict[bytes, bytes]:
    def b(value: str | int | bytes) -> bytes:
        return value if isinstance(value, bytes) else str(value).encode()
    return {b(k): b(v) for k, v in fields.items()}


def frame(room: str, seq: int, chunk: int) -> bytes:
    return AudioFrame(room=room, seq=seq, chunk=chunk, pts_us=chunk * 40_000, sample_rate=ROOM_RATE,
                      samples=SLICE_SAMPLES, payload=bytes(2 * SLICE_SAMPLES), first=chunk == 0).encode()


@pytest.fixture(scope="module")
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


# --- bytes in, frames out ---------------------------------------------------------------------


def test_a_group_is_the_same_frames_in_order_and_one_slice_is_the_old_entry() -> None:
    frames = [frame("r", 1, c) for c in (4, 5, 6)]
    opus = [b"opus-4", b"opus-5", b"opus-6"]
    entry = as_redis_returns(group_fields(1, 4, frames, opus))
    assert slice_frames(entry) == frames
    assert slice_frames(entry, opus=True) == opus
    assert slice_frames(entry, skip=2) == frames[2:]
    assert entry_items(entry, CODEC_PCM16, "anyone") == frames and entry_items(entry, CODEC_OPUS, "anyone") == opus
    assert group_fields(1, 4, frames[:1]) == chunk_fields(1, 4, frames[0]), "one slice: the entry as before"
    assert slice_frames(as_redis_returns(chunk_fields(1, 4, frames[0]))) == frames[:1]
    with pytest.raises(ValueError):
        group_fields(1, 0, [frames[0]] * (MAX_GROUP + 1))
    broken = dict(entry)
    del broken[b"frame2"]
    with pytest.raises(ValueError):
        slice_frames(broken)
    assert entry_items(broken, CODEC_PCM16, "anyone") == [], "a malformed entry is skipped, not a crash"


def test_client_items_expand_groups_between_control_entries() -> None:
    f = [frame("r", 2, c) for c in range(5)]
    stream = [entry_fields(start_message(2, sender="s", voice="v", text="t", pts_ms=0.0)),
              chunk_fields(2, 0, f[0]), group_fields(2, 1, f[1:3]), group_fields(2, 3, f[3:5]),
              entry_fields(end_message(2, chunks=5, duration_ms=200.0))]
    raw = [[f"{i}-0".encode(), [x for kv in as_redis_returns(e).items() for x in kv]] for i, e in enumerate(stream)]
    items = client_items(raw, CODEC_PCM16, "anyone")
    assert isinstance(items[0], str) and isinstance(items[-1], str)
    assert [AudioFrame.decode(i).chunk for i in items if isinstance(i, bytes)] == [0, 1, 2, 3, 4]


def test_the_position_may_be_inside_a_group_and_the_rest_of_it_is_news() -> None:
    group = as_redis_returns(group_fields(7, 10, [b"a", b"b"]))
    assert stop_here(ResumePoint(7, 10), group) and held_slices(ResumePoint(7, 10), group) == 1
    assert stop_here(ResumePoint(7, 11), group) and held_slices(ResumePoint(7, 11), group) == 2
    assert not stop_here(ResumePoint(7, 12), group), "a later slice is in a later entry"
    assert not stop_here(ResumePoint(7, 9), group)
    assert not stop_here(ResumePoint(7, -1), group) and not stop_here(ResumePoint(7, -1, has_end=True), group)
    assert stop_here(ResumePoint(8, 0), group) and held_slices(ResumePoint(8, 0), group) == 2, \
        "an earlier utterance's group is held whole"


# --- the real publisher -------------------------------------------------------------------------


async def _publish(r: Redis, bus: FencedJobBus, room: str, slices: int, *, paced: bool) -> None:
    await r.xadd(keys.JOBS, {"room": room, "seq": 1, "text": "Night falls.", "voice": "en-joe",
                             "prev_voice": "en-joe", "sender": "gm", "time": 0})
    jobs = [job for job in await bus.read_jobs(10, 1000) if job.room == room]
    job: Job = jobs[0]
    utt = Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))
    utt.slices.extend([np.full(SLICE_SAMPLES, c, dtype=np.int16) for c in range(slices)])
    utt.slices.close()
    await publish_utterance(bus, utt, RoomClock(), lead_ms=120, order_wait_ms=1000, voice_name="en-joe",
                            paced=paced)


@pytest.mark.parametrize("paced", [True, False])
async def test_the_publisher_groups_paced_slices_after_the_first_and_clients_get_each_once(
        own_redis: RedisServer, paced: bool, stores: Stores) -> None:
    r = redis_client.from_url(own_redis.url, decode_responses=True)
    raw = redis_client.from_url(own_redis.url)
    bus = await stores.bus(r, f"w-{uuid.uuid4().hex[:6]}")
    room = f"grp-{uuid.uuid4().hex[:8]}"
    try:
        await bus.ensure_group()
        await _publish(r, bus, room, 7, paced=paced)
        entries: Any = await raw.xrange(keys.room_output(room))
        chunks = [(int(f[b"chunk"]), int(f.get(b"slices", b"1"))) for _, f in entries if f[b"kind"] == b"chunk"]
        if paced:  # the first alone (it is what the room waits for), then groups
            assert chunks == [(0, 1), (1, PACED_GROUP), (3, PACED_GROUP), (5, PACED_GROUP)]
        else:  # unpaced (private API rooms, read by app/api/speech_room.py): one slice an entry, as before
            assert chunks == [(c, 1) for c in range(7)]
        items = client_items([[i, [x for kv in f.items() for x in kv]] for i, f in entries], CODEC_PCM16, "anyone")
        heard = [AudioFrame.decode(i) for i in items if isinstance(i, bytes)]
        assert [(f.chunk, int(np.frombuffer(f.payload, dtype="<i2")[SLICE_SAMPLES // 2])) for f in heard] == [
            (c, c) for c in range(7)], "each slice once, in order, its own audio"
        assert [f.last for f in heard] == [False] * 6 + [True]
        assert all(b - a == 40_000 for a, b in zip([f.pts_us for f in heard], [f.pts_us for f in heard[1:]],
                                                   strict=False)), "gapless on the room clock"
    finally:
        await bus.close()
        await r.aclose()
        await raw.aclose()


# --- a real gateway replays grouped entries ------------------------------------------------------


async def test_a_client_resuming_inside_a_group_gets_the_rest_of_it_then_the_next(
        own_redis: RedisServer, tmp_path: Path) -> None:
    room = f"rg-{uuid.uuid4().hex[:8]}"
    raw = redis_client.from_url(own_redis.url)
    f = [frame(room, 1, c) for c in range(5)]
    for entry in [entry_fields(start_message(1, sender="s", voice="en-joe", text="t", pts_ms=0.0)),
                  chunk_fields(1, 0, f[0]), group_fields(1, 1, f[1:3]), group_fields(1, 3, f[3:5]),
                  entry_fields(end_message(1, chunks=5, duration_ms=200.0))]:
        await raw.xadd(keys.room_output(room), entry)  # type: ignore[arg-type]
    gateway, port = start_gateway(own_redis.url, tmp_path)
    try:
        for point, expected in (("1.1", [2, 3, 4]), ("1.2", [3, 4]), ("1.3", [4]), ("1.0", [1, 2, 3, 4]),
                                ("1.start", [0, 1, 2, 3, 4])):
            async with RoomClient(port, room, client=f"c{point.replace('.', '-')}", resume=point) as client:
                await client.wait_for(lambda g: bool(g.ends()), 30)
                assert [fr.chunk for fr in client.got.frames] == expected, point
                # 1.start names the start the client holds: it is not sent again (issue 28.6)
                assert [m["type"] for m in client.got.messages if m.get("type") in ("start", "end")] == ["end"], point
    finally:
        gateway.stop()
        await raw.aclose()


async def test_a_replay_of_many_groups_fits_the_queue_and_drops_nothing(
        own_redis: RedisServer, tmp_path: Path) -> None:
    # 241 slices, 120 entries of two after the first: more slices than a client's queue (50)
    # holds, read a page at a time. Queued entry by entry: before, a page of 25 entries was 50
    # frames into a half-full queue, and the oldest were dropped.
    room = f"rl-{uuid.uuid4().hex[:8]}"
    raw = redis_client.from_url(own_redis.url)
    f = [frame(room, 1, c) for c in range(241)]
    pipe = raw.pipeline(transaction=False)
    for entry in [entry_fields(start_message(1, sender="s", voice="en-joe", text="t", pts_ms=0.0)),
                  chunk_fields(1, 0, f[0]), *(group_fields(1, c, f[c:c + 2]) for c in range(1, 241, 2)),
                  entry_fields(end_message(1, chunks=241, duration_ms=241 * 40.0))]:
        pipe.xadd(keys.room_output(room), entry)  # type: ignore[arg-type]
    await pipe.execute()
    gateway, port = start_gateway(own_redis.url, tmp_path)
    try:
        async with RoomClient(port, room, client="long", resume="1.start") as client:
            await client.wait_for(lambda g: bool(g.ends()), 30)
            assert [fr.chunk for fr in client.got.frames] == list(range(241))
    finally:
        gateway.stop()
        await raw.aclose()
