"""``POST /v1/audio/speech`` over a real gateway and worker: streamed, parseable, speech, cleaned up."""

from __future__ import annotations

import asyncio
import io
import struct
import wave
from pathlib import Path

import av
import httpx
import numpy as np
import pytest
from redis.asyncio import Redis

from tests.conftest import Stack
from tests.support.audio import is_speech_like, voiced_duration_s
from tests.support.processes import start_gateway
from voxroom.store import keys
from voxroom.wire import tokens
from voxroom.wire.protocol import ROOM_RATE

LINE = "Good evening, villagers. Tonight the werewolves will choose their victim."


async def speech(stack: Stack, **body: object) -> tuple[httpx.Response, bytes, int]:
    """The response, its body, and how many pieces it arrived in."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=30) as http, \
            http.stream("POST", "/v1/audio/speech", json=body) as resp:
        pieces = [piece async for piece in resp.aiter_raw()]
    return resp, b"".join(pieces), len(pieces)


def decode(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        frames = [f.to_ndarray().astype(np.float64).reshape(f.samples, -1).mean(axis=1)
                  for f in container.decode(audio=0)]
        rate = container.streams.audio[0].codec_context.sample_rate
    audio = np.concatenate(frames)
    return np.asarray(audio if np.abs(audio).max() <= 1.5 else audio / 32768) if rate == ROOM_RATE else \
        np.interp(np.arange(0, audio.size, rate / ROOM_RATE), np.arange(audio.size), audio)


async def test_a_streamed_wav_parses_and_is_speech_of_plausible_length(stack: Stack) -> None:
    resp, data, pieces = await speech(stack, model="tts-1", input=LINE, voice="en-espeak", response_format="wav")
    assert resp.status_code == 200, data[:300]
    assert resp.headers["content-type"] == "audio/wav"
    assert resp.headers.get("transfer-encoding") == "chunked" and "content-length" not in resp.headers
    assert pieces >= 2, "the body should stream, not arrive in one piece"
    assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt "
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, ROOM_RATE)
        frames = wav.readframes(wav.getnframes())
    assert len(frames) == len(data) - 44
    audio = np.frombuffer(frames, dtype="<i2").astype(np.float64) / 32768
    verdict = is_speech_like(audio, ROOM_RATE)
    assert verdict, verdict.reason
    assert 2.0 <= voiced_duration_s(audio, ROOM_RATE) <= 8.0  # 11 words at ordinary speaking rates


async def test_pcm_opus_and_mp3_carry_the_same_speech_and_speed_shortens_it(stack: Stack) -> None:
    _, pcm, _ = await speech(stack, input=LINE, voice="en-espeak", response_format="pcm")
    reference = np.frombuffer(pcm, dtype="<i2").astype(np.float64) / 32768
    for fmt, content_type in (("opus", "audio/ogg"), ("mp3", "audio/mpeg")):
        resp, data, _ = await speech(stack, input=LINE, voice="en-espeak", response_format=fmt)
        assert resp.status_code == 200 and resp.headers["content-type"] == content_type
        audio = decode(data)
        verdict = is_speech_like(audio, ROOM_RATE)
        assert verdict, (fmt, verdict.reason)
        assert abs(audio.size - reference.size) / ROOM_RATE < 0.15, fmt
    _, fast, _ = await speech(stack, input=LINE, voice="en-espeak", response_format="pcm", speed=2.0)
    assert 0.4 < len(fast) / len(pcm) < 0.6


async def test_openai_voice_names_and_scenes_pick_catalog_voices(stack: Stack) -> None:
    resp, data, _ = await speech(stack, input="Hello there.", voice="nova", response_format="wav")
    assert resp.status_code == 200 and resp.headers["x-voxroom-voice"] == "en-espeak-f"
    resp, _, _ = await speech(stack, input="你好。", scene={"language": "mandarin", "age": "elderly"},
                              response_format="pcm")
    assert resp.status_code == 200 and resp.headers["x-voxroom-voice"] == "cmn-espeak-grandma"


@pytest.mark.parametrize(("body", "code"), [
    ({"input": "hi", "voice": "no-such-voice"}, "unknown_voice"),
    ({"input": "   "}, "empty_text"),
    ({"input": "x" * 4097}, "text_too_long"),
    ({"input": "hi", "response_format": "ogg-vorbis"}, "unsupported_format"),
    ({"input": "hi", "speed": 5}, "bad_message"),
    ({"input": "hi", "stream_format": "sse"}, "unsupported_format"),
])
async def test_bad_requests_get_openai_shaped_400s(stack: Stack, body: dict[str, object], code: str) -> None:
    resp, data, _ = await speech(stack, **body)
    assert resp.status_code == 400
    error = httpx.Response(400, content=data).json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error" and error["message"]


async def test_the_private_room_is_gone_after_the_response(stack: Stack) -> None:
    resp, data, _ = await speech(stack, input="The game is over.", voice="en-espeak", response_format="wav")
    assert resp.status_code == 200
    assert struct.unpack("<I", data[40:44])[0] == 0xFFFFFFFF  # streamed: size unknown up front
    redis = Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        for _ in range(50):
            left = [k async for k in redis.scan_iter(match=keys.room_pattern(keys.PRIVATE_ROOM_PREFIX + "*"))]
            if not left:
                break
            await asyncio.sleep(0.1)
        assert left == []
        assert not [r for r in await redis.zrange(keys.ROOMS, 0, -1) if r.startswith(keys.PRIVATE_ROOM_PREFIX)]
    finally:
        await redis.aclose()


async def test_a_caller_that_leaves_mid_stream_leaves_no_keys_without_a_ttl(stack: Stack) -> None:
    long_line = " ".join([LINE] * 6)[:500]
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=30) as http:
        async with http.stream("POST", "/v1/audio/speech",
                               json={"input": long_line, "voice": "en-espeak", "response_format": "pcm"}) as resp:
            assert resp.status_code == 200
            async for _ in resp.aiter_raw():
                break  # hang up after the first piece
    redis = Redis.from_url(stack.redis_url, decode_responses=True)
    try:
        await asyncio.sleep(0.5)
        async for key in redis.scan_iter(match=keys.room_pattern(keys.PRIVATE_ROOM_PREFIX + "*")):
            assert await redis.ttl(key) > 0, key
    finally:
        await redis.aclose()
    resp, _, _ = await speech(stack, input="Still serving.", voice="en-espeak", response_format="pcm")
    assert resp.status_code == 200


async def test_past_the_stream_limit_the_answer_is_503_with_retry_after(
        stack: Stack, tmp_path: Path) -> None:
    gateway, port = start_gateway(stack.redis_url, tmp_path, VOXROOM_SPEECH_MAX_STREAMS="0")
    try:
        async with httpx.AsyncClient(timeout=10) as http:
            resp = await http.post(f"http://127.0.0.1:{port}/v1/audio/speech", json={"input": "hi"})
        assert resp.status_code == 503 and resp.headers["retry-after"] == "1"
        assert resp.json()["error"]["code"] == "busy"
    finally:
        gateway.stop()


async def test_with_auth_on_it_takes_a_speaker_bearer_token_for_the_api(stack: Stack, tmp_path: Path) -> None:
    secret = "s" * 40
    gateway, port = start_gateway(stack.redis_url, tmp_path, insecure=False, VOXROOM_JWT_SECRET=secret)
    body = {"input": "Authorised.", "voice": "en-espeak", "response_format": "pcm"}
    url = f"http://127.0.0.1:{port}/v1/audio/speech"
    try:
        async with httpx.AsyncClient(timeout=20) as http:
            missing = await http.post(url, json=body)
            assert missing.status_code == 401 and missing.headers["www-authenticate"] == "Bearer"
            assert missing.json()["error"]["code"] == "invalid_api_key"
            forged = await http.post(url, json=body, headers={"Authorization": "Bearer " + tokens.mint(
                "x" * 40, "*", "speaker")})
            assert forged.status_code == 401
            other_room = tokens.mint(secret, "some-room", "speaker")
            assert (await http.post(url, json=body, headers={"Authorization": f"Bearer {other_room}"})).status_code \
                == 401
            listener = tokens.mint(secret, "_api", "listener")
            assert (await http.post(url, json=body, headers={"Authorization": f"Bearer {listener}"})).status_code \
                == 403
            for room in ("_api", "*"):
                ok = await http.post(url, json=body,
                                     headers={"Authorization": f"Bearer {tokens.mint(secret, room, 'speaker')}"})
                assert ok.status_code == 200 and len(ok.content) > 10_000, room
            assert (await http.get(f"http://127.0.0.1:{port}/v1/voices")).status_code == 200  # the catalog is public
    finally:
        gateway.stop()


async def test_waiting_responses_share_one_blocked_read(tmp_path: Path) -> None:
    """Six responses waiting for their first audio (the worker is paused) wait on the gateway's one
    stream watcher (voxroom/store/single/watcher.py), not on a blocked XREAD each; all answer once the
    worker goes on."""
    import os
    import signal

    from tests.support.processes import start_worker
    from voxroom.store.server import RedisServer

    with RedisServer() as server:
        worker = start_worker(server.url, tmp_path)
        gateway, port = start_gateway(server.url, tmp_path)
        admin = Redis.from_url(server.url, decode_responses=True)
        try:
            async def blocked_reads() -> int:
                return sum(1 for c in await admin.client_list()
                           if c.get("cmd") == "xread" and "b" in c.get("flags", ""))

            # The processes' own watchers, always there; the most seen over a second, since one
            # sample can fall between a watcher's two blocked reads.
            before = 0
            for _ in range(6):
                await asyncio.sleep(0.2)
                before = max(before, await blocked_reads())
            os.kill(worker.pid, signal.SIGSTOP)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60) as http:
                requests = [asyncio.ensure_future(http.post("/v1/audio/speech", json={
                    "model": "tts-1", "input": f"Line {n} for the waiting room.", "voice": "en-espeak",
                    "response_format": "pcm"})) for n in range(6)]
                for _ in range(100):
                    await asyncio.sleep(0.1)
                    if len(await admin.keys(keys.room_utterances(keys.PRIVATE_ROOM_PREFIX + "*"))) == 6:
                        break
                waiting = await admin.keys(keys.room_utterances(keys.PRIVATE_ROOM_PREFIX + "*"))
                assert len(waiting) == 6, "all six accepted and waiting"
                await asyncio.sleep(0.5)
                during = await blocked_reads()
                assert during <= before, f"{during - before} more blocked reads for six waiting responses"
                os.kill(worker.pid, signal.SIGCONT)
                responses = await asyncio.gather(*requests)
            assert [r.status_code for r in responses] == [200] * 6
            assert all(len(r.content) > ROOM_RATE // 2 for r in responses), "each is audio"
        finally:
            os.kill(worker.pid, signal.SIGCONT)
            await admin.aclose()
            gateway.stop()
            worker.stop()
