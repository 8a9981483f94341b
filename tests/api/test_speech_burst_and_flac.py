"""The stream cap holds under a burst (counted on the server), and FLAC is readable by libsndfile."""

from __future__ import annotations

import asyncio
import io
import os
import signal
from pathlib import Path

import httpx
import numpy as np
import soundfile

from tests.conftest import Stack
from tests.support.audio import is_speech_like
from tests.support.processes import start_gateway
from voxroom.wire.protocol import ROOM_RATE

CAP = 4
BURST = 40


def gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"{name} "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


async def test_a_burst_never_holds_more_streams_than_the_cap_and_the_rest_wait_as_told(
        stack: Stack, tmp_path: Path) -> None:
    """The worker is paused for the burst, so every admitted response holds its slot until all 40
    were answered or admitted: exactly the cap admitted, the rest 503 with ``Retry-After``."""
    gateway, port = start_gateway(stack.redis_url, tmp_path, VOXROOM_SPEECH_MAX_STREAMS=str(CAP))
    os.kill(stack.worker.pid, signal.SIGSTOP)
    try:
        limits = httpx.Limits(max_connections=BURST)
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=90, limits=limits) as http:
            assert gauge((await http.get("/metrics")).text, "voxroom_speech_streams_peak") == 0
            burst = [asyncio.ensure_future(http.post("/v1/audio/speech", json={
                "input": f"Number {n}: the night is long and the wolves are hungry.", "voice": "en-espeak",
                "response_format": "pcm"})) for n in range(BURST)]
            for _ in range(600):
                if sum(task.done() for task in burst) >= BURST - CAP:
                    break
                await asyncio.sleep(0.1)
            during = (await http.get("/metrics")).text
            os.kill(stack.worker.pid, signal.SIGCONT)
            responses = await asyncio.gather(*burst)
            after = (await http.get("/metrics")).text
        assert gauge(during, "voxroom_speech_streams") == CAP
        statuses = [r.status_code for r in responses]
        assert sorted(statuses) == [200] * CAP + [503] * (BURST - CAP), statuses
        for resp in responses:
            if resp.status_code == 503:
                assert resp.json()["error"]["code"] == "busy" and resp.json()["error"]["type"] == "server_error"
                assert int(resp.headers["retry-after"]) >= 1
            else:
                assert len(resp.content) > ROOM_RATE, "a served line is audio"
        assert gauge(after, "voxroom_speech_streams_peak") == CAP, "never more than the cap at once"
        assert gauge(after, "voxroom_speech_streams") == 0, "every slot given back"
    finally:
        os.kill(stack.worker.pid, signal.SIGCONT)
        gateway.stop()


async def test_flac_is_readable_by_libsndfile_and_is_the_same_speech_as_pcm(stack: Stack) -> None:
    line = "The lantern swung once in the wind, and nobody slept."
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=60) as http:
        pcm = await http.post("/v1/audio/speech", json={"input": line, "voice": "en-espeak", "response_format": "pcm"})
        flac = await http.post("/v1/audio/speech", json={"input": line, "voice": "en-espeak",
                                                         "response_format": "flac"})
    assert flac.status_code == 200 and flac.headers["content-type"] == "audio/flac"
    audio, rate = soundfile.read(io.BytesIO(flac.content), dtype="float64")
    info = soundfile.info(io.BytesIO(flac.content))
    assert rate == ROOM_RATE and info.channels == 1 and info.frames == audio.size > 0
    reference = np.frombuffer(pcm.content, dtype="<i2").astype(np.float64) / 32768
    assert abs(audio.size - reference.size) / ROOM_RATE < 0.15
    verdict = is_speech_like(audio, ROOM_RATE)
    assert verdict, verdict.reason


async def test_every_format_libsndfile_knows_it_reads(stack: Stack) -> None:
    """AAC excepted: libsndfile has no AAC reader at all (FFmpeg reads it: test_openai_sdk.py)."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=60) as http:
        for fmt in ("wav", "flac", "mp3", "opus"):
            resp = await http.post("/v1/audio/speech", json={"input": "Hello there, how are you.",
                                                             "voice": "en-espeak", "response_format": fmt})
            assert resp.status_code == 200, fmt
            audio, rate = soundfile.read(io.BytesIO(resp.content))
            assert rate == ROOM_RATE and audio.ndim == 1 and audio.size > ROOM_RATE // 2, fmt
