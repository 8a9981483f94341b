"""The worker's metrics pieces on their own: the asyncio HTTP server over a real socket, and the
stage arithmetic fed values."""

from __future__ import annotations

import asyncio
import socket

import pytest
from prometheus_client import CollectorRegistry, Counter

from voxroom.wire.jobs import Job
from workers.intake.metrics import FIRST_AUDIO_STAGE, TIME_TO_FIRST_AUDIO, UTTERANCES, observe_utterance, stage_seconds
from workers.intake.metrics_http import HEAD_LIMIT, MetricsServer
from workers.output.publisher import PublishResult
from workers.utterance import SliceBuffer, Utterance


async def request(port: int, raw: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()
        await writer.wait_closed()


async def test_the_server_answers_get_and_head_of_metrics_and_nothing_else() -> None:
    registry = CollectorRegistry()
    Counter("vx_test_things", "Things.", registry=registry).inc(3)
    server = MetricsServer(registry, port=0)
    port = await server.start()
    assert port
    try:
        got = await request(port, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        head, _, body = got.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 200 OK") and b"Connection: close" in head
        assert b"vx_test_things_total 3.0" in body
        assert f"Content-Length: {len(body)}".encode() in head
        head_only = await request(port, b"HEAD /metrics?x=1 HTTP/1.1\r\n\r\n")
        assert head_only.startswith(b"HTTP/1.1 200 OK") and head_only.endswith(b"\r\n\r\n")
        assert (await request(port, b"POST /metrics HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 405")
        assert (await request(port, b"GET /admin HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404")
        # A head past the limit is closed unanswered; a silent client holds no scrape up.
        assert await request(port, b"GET /metrics HTTP/1.1\r\nX: " + b"a" * HEAD_LIMIT + b"\r\n\r\n") == b""
        _, silent = await asyncio.open_connection("127.0.0.1", port)
        try:
            assert b"vx_test_things_total" in await request(port, b"GET / HTTP/1.0\r\n\r\n")
        finally:
            silent.close()
            await silent.wait_closed()
    finally:
        await server.aclose()


async def test_a_port_in_use_turns_metrics_off_instead_of_failing() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = MetricsServer(CollectorRegistry(), port=taken.getsockname()[1])
        assert await server.start() is None
        await server.aclose()


def utterance(**fields: float | None) -> Utterance:
    job = Job(entry_id="1-0", room="r", seq=1, text="t", voice="v", prev_voice="v", sender="", time_ms=1000.0)
    utt = Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))
    for name, value in fields.items():
        setattr(utt, name, value)
    return utt


async def test_the_stages_add_up_to_the_time_to_first_audio() -> None:
    utt = utterance(read_ms=1010.0, synth_started_ms=1030.0, engine_first_chunk_ms=100.0)
    stages = stage_seconds(utt, first_slice_ms=1250.0)
    assert stages == {"total": 0.25, "read": 0.01, "to_engine": 0.02, "engine_first_chunk": 0.1,
                      "to_published": 0.12}
    assert sum(v for k, v in stages.items() if k != "total" and v is not None) == pytest.approx(0.25)


async def test_a_line_that_never_reached_a_slice_is_counted_but_not_timed() -> None:
    utt = utterance(read_ms=1010.0)
    utt.source = "engine"
    stages = stage_seconds(utt, first_slice_ms=None)
    assert stages["total"] is None and stages["to_engine"] is None and stages["read"] == 0.01

    def count(metric: str, **labels: str) -> float:
        for family in (UTTERANCES, TIME_TO_FIRST_AUDIO, FIRST_AUDIO_STAGE):
            for f in family.collect():
                for s in f.samples:
                    if s.name == metric and labels.items() <= s.labels.items():
                        return s.value
        return 0.0

    failed = count("voxroom_worker_utterances_total", engine="unit", status="failed")
    timed = count("voxroom_worker_time_to_first_audio_seconds_count", engine="unit")
    observe_utterance("unit", utt, PublishResult("failed", 0, 0.0, None, 0), stages)
    assert count("voxroom_worker_utterances_total", engine="unit", status="failed") == failed + 1
    assert count("voxroom_worker_time_to_first_audio_seconds_count", engine="unit") == timed
    assert count("voxroom_worker_first_audio_stage_seconds_count", engine="unit", stage="read") == 0
