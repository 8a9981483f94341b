"""``start``, ``marks`` and ``end`` are built once (voxroom/wire/protocol.py), written as output-stream
entries (voxroom/wire/output_entries.py) and read back into the same client messages: bytes in, messages
out. The last test runs the real publisher against a real redis-server and reads what a gateway
sends its clients."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from app.fanout.entries import client_items, control_message
from app.fanout.resume import ResumePoint, stop_here
from tests.support.stores import Stores
from voxroom.store import clients as redis_client
from voxroom.store import keys
from voxroom.store.server import RedisServer
from voxroom.wire.jobs import Job
from voxroom.wire.output_entries import EntryFields, chunk_fields, control_from_entry, entry_fields, group_fields
from voxroom.wire.protocol import (
    CODEC_PCM16,
    MAX_END_ERROR_CHARS,
    ROOM_RATE,
    SLICE_SAMPLES,
    AudioFrame,
    ErrorCode,
    WordMark,
    end_message,
    marks_message,
    start_message,
)
from workers.output.clock import RoomClock
from workers.output.publisher import publish_utterance
from workers.utterance import SliceBuffer, Utterance


def as_redis_returns(fields: EntryFields) -> dict[bytes, bytes]:
    """An entry as XRANGE gives it back when read raw: every name and value bytes."""
    def b(value: str | int | bytes) -> bytes:
        return value if isinstance(value, bytes) else str(value).encode()
    return {b(k): b(v) for k, v in fields.items()}


def test_start_round_trips_restart_only_when_true() -> None:
    first = start_message(7, sender="gm", voice="en-joe", text="Night falls, 村民.", pts_ms=1764546000123.4567)
    assert first == {"type": "start", "utterance": 7, "sender": "gm", "voice": "en-joe", "text": "Night falls, 村民.",
                     "pts_ms": 1764546000123.457, "sample_rate": ROOM_RATE}
    assert "restart" not in entry_fields(first)
    assert control_from_entry(as_redis_returns(entry_fields(first))) == first
    again = start_message(7, sender="gm", voice="en-joe", text="x", pts_ms=5.0, restart=True)
    assert entry_fields(again)["restart"] == 1
    assert control_from_entry(as_redis_returns(entry_fields(again))) == {**again, "restart": True}


def test_a_failed_end_carries_synthesis_failed_and_a_short_error() -> None:
    ok = end_message(3, chunks=12, duration_ms=480.04)
    assert ok == {"type": "end", "utterance": 3, "chunks": 12, "duration_ms": 480.0, "status": "ok"}
    failed = end_message(3, chunks=2, duration_ms=80.0, error="RuntimeError: " + "x" * 500)
    assert failed["status"] == "failed" and failed["code"] == ErrorCode.SYNTHESIS_FAILED
    assert failed["error"].startswith("RuntimeError: ") and len(failed["error"]) == MAX_END_ERROR_CHARS
    for msg in (ok, failed):
        fields = entry_fields(msg, room_end_ms=1764546000999.5)
        assert fields["pts_ms"] == "1764546000999.500"  # the room's end, for operators only
        back = control_from_entry(as_redis_returns(fields))
        assert back == msg
        assert "pts_ms" not in json.loads(control_message(as_redis_returns(fields)) or "{}")


def test_an_end_written_before_code_existed_still_says_why() -> None:
    old = {b"kind": b"end", b"seq": b"4", b"chunks": b"0", b"duration_ms": b"0.0", b"status": b"failed",
           b"error": b"engine gone", b"pts_ms": b"1.000"}
    assert control_from_entry(old) == {"type": "end", "utterance": 4, "chunks": 0, "duration_ms": 0.0,
                                       "status": "failed", "code": "synthesis_failed", "error": "engine gone"}


def test_marks_round_trip_with_code_point_offsets() -> None:
    words: list[WordMark] = [
        {"text": "Night", "start_ms": 1764546000123.0, "end_ms": 1764546000433.0001, "offset": 0, "length": 5},
        {"text": "村", "start_ms": 1764546000500.0, "end_ms": 1764546000700.0, "offset": 13, "length": 1}]
    msg = marks_message(7, words)
    assert msg["words"][0]["end_ms"] == 1764546000433.0
    fields = entry_fields(msg)
    assert fields["kind"] == "marks" and json.loads(str(fields["words"])) == msg["words"]
    assert control_from_entry(as_redis_returns(fields)) == msg


def test_chunks_and_unknown_kinds_are_no_control_message_and_bad_entries_are_refused() -> None:
    assert control_from_entry(as_redis_returns(chunk_fields(1, 0, b"VX..", b"opus"))) is None
    assert control_from_entry({b"kind": b"captions", b"seq": b"1"}) is None  # a newer worker's kind
    for bad in ({b"kind": b"start"}, {b"kind": b"end", b"seq": b"1", b"status": b"skipped"},
                {b"kind": b"marks", b"seq": b"1", b"words": b"{}"}, {b"kind": b"marks", b"seq": b"1"},
                {b"kind": b"start", b"seq": b"1", b"text": b"\xff"}):
        with pytest.raises(ValueError):
            control_from_entry(bad)
        assert control_message(bad) is None  # a gateway skips it and keeps serving the room


@pytest.fixture(scope="module")
def own_redis_url() -> Iterator[str]:
    """A redis-server of this module's own: the suite's shared one has the session stack's worker
    reading ``vx:jobs``, and it would take the job this test writes."""
    with RedisServer() as server:
        yield server.url


@pytest.mark.parametrize("error", [None, "ValueError: the engine could not say it"])
async def test_the_publisher_writes_what_clients_get(own_redis_url: str, error: str | None, stores: Stores) -> None:
    """The real publisher against a real redis-server: the client messages of what it wrote are
    the protocol's messages, an error included (before, ``End`` had no ``error`` nor ``code``)."""
    redis_url = own_redis_url
    r = redis_client.from_url(redis_url, decode_responses=True)
    raw = redis_client.from_url(redis_url)  # entries carry audio: read them as bytes
    bus = await stores.bus(r, f"w-{uuid.uuid4().hex[:6]}")
    room = f"ctl-{uuid.uuid4().hex[:8]}"
    try:
        await bus.ensure_group()
        await r.xadd(keys.JOBS, {"room": room, "seq": 1, "text": "Night falls.", "voice": "en-joe",
                                 "prev_voice": "en-joe", "sender": "gm", "time": 0})
        jobs = [job for job in await bus.read_jobs(10, 1000) if job.room == room]
        job: Job = jobs[0]
        utt = Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))
        utt.slices.extend([np.full(SLICE_SAMPLES, 1000, dtype=np.int16)] * 3)
        utt.error = error
        utt.slices.close()
        result = await publish_utterance(bus, utt, RoomClock(), lead_ms=120, order_wait_ms=1000,
                                         voice_name="en-joe", paced=False)
        entries: Any = await raw.xrange(keys.room_output(room))
        items = client_items([[entry_id, [x for kv in fields.items() for x in kv]] for entry_id, fields in entries],
                             CODEC_PCM16, "anyone")
        texts = [json.loads(item) for item in items if isinstance(item, str)]
        assert [m["type"] for m in texts] == ["start", "end"]
        assert sum(isinstance(item, bytes) for item in items) == 3
        start, end = texts
        assert start == {**start_message(1, sender="gm", voice="en-joe", text="Night falls.",
                                         pts_ms=start["pts_ms"])}
        assert end == end_message(1, chunks=3, duration_ms=120.0, error=error)
        assert result.status == end["status"] == ("failed" if error else "ok")
        if error:
            assert (end["code"], end["error"]) == (ErrorCode.SYNTHESIS_FAILED, error)
    finally:
        await bus.close()
        await raw.aclose()
        await r.aclose()


async def test_a_private_line_reaches_its_audience_and_its_sender_only(own_redis_url: str, stores: Stores) -> None:
    """A job with ``to`` (a private line): the real publisher writes its audience on every entry,
    and what a gateway sends each client of the room holds the whole line for the addressees and
    the sender, nothing at all for anyone else; a public line after it reaches everyone."""
    r = redis_client.from_url(own_redis_url, decode_responses=True)
    raw = redis_client.from_url(own_redis_url)
    bus = await stores.bus(r, f"w-{uuid.uuid4().hex[:6]}")
    room = f"priv-{uuid.uuid4().hex[:8]}"
    try:
        await bus.ensure_group()
        for seq, extra in ((1, {"to": "seer witch"}), (2, {})):
            await r.xadd(keys.JOBS, {"room": room, "seq": seq, "text": f"Line {seq}.", "voice": "en-joe",
                                     "prev_voice": "en-joe", "sender": "gm", "time": 0, **extra})
        jobs = sorted((job for job in await bus.read_jobs(10, 1000) if job.room == room), key=lambda j: j.seq)
        assert [job.to for job in jobs] == [("seer", "witch"), ()]
        for job in jobs:
            utt = Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))
            utt.slices.extend([np.full(SLICE_SAMPLES, 1000, dtype=np.int16)] * 5)
            utt.slices.close()
            await publish_utterance(bus, utt, RoomClock(), lead_ms=120, order_wait_ms=1000,
                                    voice_name="en-joe", paced=False)
        entries: Any = await raw.xrange(keys.room_output(room))
        flat = [[entry_id, [x for kv in fields.items() for x in kv]] for entry_id, fields in entries]
        assert all(fields[b"to"] == b"gm seer witch" for _id, fields in entries if fields[b"seq"] == b"1")
        assert all(b"to" not in fields for _id, fields in entries if fields[b"seq"] == b"2")

        def heard(client: str) -> list[tuple[str, int]]:
            out = []
            for item in client_items(flat, CODEC_PCM16, client):
                if isinstance(item, bytes):
                    out.append(("frame", AudioFrame.decode(item).seq))
                else:
                    msg = json.loads(item)
                    out.append((msg["type"], msg["utterance"]))
            return out

        whole = [("start", 1), *[("frame", 1)] * 5, ("end", 1), ("start", 2), *[("frame", 2)] * 5, ("end", 2)]
        assert heard("seer") == heard("witch") == heard("gm") == whole
        assert heard("villager") == heard("c-seer") == whole[7:]  # a self-chosen "seer" under auth is c-seer
        start = next(json.loads(i) for i in client_items(flat, CODEC_PCM16, "seer") if isinstance(i, str))
        assert start["private"] is True and "to" not in start  # who else hears it is not said
    finally:
        await bus.close()
        await raw.aclose()
        await r.aclose()


def test_marks_reach_clients_in_stream_order_and_are_never_a_resume_position() -> None:
    start = entry_fields(start_message(9, sender="gm", voice="v", text="Night falls.", pts_ms=1000.0))
    marks = entry_fields(marks_message(9, [{"text": "Night", "start_ms": 1000.0, "end_ms": 1300.0, "offset": 0,
                                            "length": 5}]))
    end = entry_fields(end_message(9, chunks=1, duration_ms=40.0), room_end_ms=1040.0)
    stream = [start, marks, chunk_fields(9, 0, b"VX-frame"), end]
    raw = [[f"{i}-0".encode(), [x for kv in as_redis_returns(e).items() for x in kv]] for i, e in enumerate(stream)]
    items = client_items(raw, CODEC_PCM16, "anyone")
    assert [json.loads(i)["type"] if isinstance(i, str) else i for i in items] == ["start", "marks", b"VX-frame",
                                                                                   "end"]
    for point in (ResumePoint(9, -1), ResumePoint(9, 0), ResumePoint(9, -1, has_end=True)):
        assert not stop_here(point, as_redis_returns(marks))


def test_a_workers_notice_in_the_stream_is_never_a_resume_position() -> None:
    """``cancel`` (and ``piece``) entries tell the workers something and name no line: scanning
    back from the tail, the scan passes them. Read as line 0 they once ended it early, and a
    client that held slice 12 of line 9 was sent slice 16 onwards, missing 13 to 15."""
    point = ResumePoint(9, 12)
    stream = [chunk_fields(9, 12, b"VX-12"), group_fields(9, 13, [b"VX-13", b"VX-14", b"VX-15"]),
              {"kind": "cancel", "utterances": "9"}, chunk_fields(9, 16, b"VX-16")]
    scanned = [as_redis_returns(e) for e in reversed(stream)]
    stops = [stop_here(point, entry) for entry in scanned]
    assert stops == [False, False, False, True]
