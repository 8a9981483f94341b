"""``POST /v1/audio/speech`` under faults, over real processes: a body is the whole audio, or it
ends visibly broken (no terminating chunk), never a clean end to a short or doubled body.

Bodies are read by a raw HTTP client (tests/support/raw_http.py) that says whether the chunked
body ended with its terminating chunk.
"""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

from redis.asyncio import Redis

from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.raw_http import RawResponse, RawStream, post
from voxroom.store import keys
from voxroom.store.server import RedisServer
from voxroom.wire.protocol import ROOM_RATE

SPEECH = "/v1/audio/speech"
FAST_CLAIM = {"VOXROOM_CLAIM_IDLE_MS": "1500"}
PATIENT = {"VOXROOM_SEND_STALL_CLOSE_S": "60"}
"""The client pauses while the test kills something: not a stalled reader here (tests/api)."""
SENTENCES = ("The lantern swung once in the wind.", "Nobody in the village slept that night.",
             "At dawn the elder counted the houses, and one door stood open.",
             "They followed the tracks to the river, where the snow was trampled flat.")
PCM_BYTES_PER_S = ROOM_RATE * 2


def text(chars: int) -> str:
    out, n = "", 0
    while len(out) + 60 < chars:
        out = f"{out} {SENTENCES[n % len(SENTENCES)]}".strip()
        n += 1
    return out


async def test_a_response_cut_by_a_redis_restart_ends_without_its_terminating_chunk(
        own_redis: RedisServer, tmp_path: Path) -> None:
    """Redis SIGKILLed and restarted (empty) while a minute-long PCM response streams: the client
    gets what was sent, a prefix of the no-fault body (the synthetic engine says a line the same
    way every time; espeak-ng and Piper do not), and then the connection ends before the
    terminating chunk. Before, it got ``200``, a properly terminated body and a few seconds of audio."""
    worker = start_worker(own_redis.url, tmp_path, engine="synthetic")
    gateway, port = start_gateway(own_redis.url, tmp_path, **PATIENT)
    body = {"input": text(900), "voice": "en-joe", "response_format": "pcm"}
    try:
        reference = await post(port, SPEECH, body)
        assert reference.status == 200 and reference.complete
        assert len(reference.body) > 40 * PCM_BYTES_PER_S, "about a minute of audio"
        stream = RawStream(port, SPEECH, body)
        assert (await stream.start()).status == 200
        killed = False

        async def fault(resp: RawResponse) -> None:
            nonlocal killed
            if not killed and len(resp.body) >= 100_000:
                killed = True
                # Reading nothing for a moment: the gateway's send blocks, most of the audio still in Redis.
                await asyncio.sleep(1.0)
                own_redis.kill()
                own_redis.start()

        try:
            got = await stream.read_body(on_piece=fault, timeout=90)
        finally:
            await stream.close()
        assert killed
        assert not got.complete, f"a body cut by the restart ended as if whole ({len(got.body)} bytes)"
        assert got.ended in ("eof", "reset"), got.ended
        assert len(got.body) < len(reference.body)
        assert bytes(reference.body).startswith(bytes(got.body)), "what came is the audio, in order"
        assert "closing the connection before the end of the body" in gateway.log_text()
        # And the gateway serves whole bodies again once Redis is back.
        for _ in range(60):
            again = await post(port, SPEECH, {"input": "The storm is over.", "voice": "en-espeak",
                                              "response_format": "pcm"})
            if again.status == 200:
                break
            await asyncio.sleep(0.5)
        assert again.status == 200 and again.complete and len(again.body) > PCM_BYTES_PER_S / 2
    finally:
        gateway.stop()
        worker.stop()


async def test_a_worker_killed_mid_line_leaves_a_body_equal_to_the_no_fault_one(
        own_redis: RedisServer, tmp_path: Path) -> None:
    """The synthetic engine (the same samples on every take) at a quarter of real time: the worker
    is SIGKILLed 4 s of audio into a 20 s line, another takes the line over and publishes it again
    from its first slice (``restart``). The body is exactly the no-fault body: the first take's
    unsent slices dropped, the second take's first samples checked against what was sent and
    skipped. Before, the body held the first take's slices and then the whole second take."""
    env = {**FAST_CLAIM, "VOXROOM_SYNTHETIC_RTF": "0.25", "VOXROOM_CACHE_SLOTS": "0"}
    doomed = start_worker(own_redis.url, tmp_path, engine="synthetic", name="doomed", **env)
    gateway, port = start_gateway(own_redis.url, tmp_path, **PATIENT)
    heir: Proc | None = None
    body = {"input": text(280), "voice": "en-joe", "response_format": "pcm"}
    try:
        stream = RawStream(port, SPEECH, body)
        assert (await stream.start()).status == 200

        async def fault(resp: RawResponse) -> None:
            nonlocal heir
            if heir is None and len(resp.body) >= 4 * PCM_BYTES_PER_S:
                doomed.kill()
                heir = start_worker(own_redis.url, tmp_path, engine="synthetic", name="heir", **env)

        try:
            got = await stream.read_body(on_piece=fault, timeout=90)
        finally:
            await stream.close()
        assert heir is not None
        reference = await post(port, SPEECH, body)
        assert reference.complete and len(reference.body) > 15 * PCM_BYTES_PER_S
        assert got.complete, got.ended
        assert len(got.body) == len(reference.body), (len(got.body), len(reference.body))
        assert bytes(got.body) == bytes(reference.body), "the line once, whole, in order"
        assert "restarted by another worker" in gateway.log_text(), "the kill landed mid-line"
    finally:
        gateway.stop()
        for worker in (doomed, heir):
            if worker is not None:
                worker.stop()


async def test_a_line_restarted_as_other_audio_fails_the_response_visibly(
        own_redis: RedisServer, tmp_path: Path) -> None:
    """Piper's takes of one line differ (VITS samples noise; ChatTTS's differ altogether): a worker
    stopped and killed mid-line after its first audio was sent, its line restarted by another
    worker, cannot be continued from the same point. The body ends without its terminating chunk
    (counted as ``takes_differ``) instead of saying the line's start twice."""
    env = {**FAST_CLAIM, "VOXROOM_CACHE_SLOTS": "0"}
    doomed = start_worker(own_redis.url, tmp_path, name="doomed", **env)
    gateway, port = start_gateway(own_redis.url, tmp_path, **PATIENT)
    heir: Proc | None = None
    body = {"input": text(480), "voice": "en-joe", "response_format": "pcm"}
    redis = Redis.from_url(own_redis.url, decode_responses=True)
    try:
        for _attempt in range(3):  # until the stop lands mid-line (Piper says a line in about a second)
            stream = RawStream(port, SPEECH, body)
            assert (await stream.start()).status == 200  # the line's first audio exists, and is on its way
            os.kill(doomed.pid, signal.SIGSTOP)
            states = [k async for k in redis.scan_iter(match=keys.room_state(keys.PRIVATE_ROOM_PREFIX + "*"))]
            assert len(states) == 1, states
            if await redis.hget(states[0], "next") in (None, "1"):
                break
            os.kill(doomed.pid, signal.SIGCONT)
            await stream.read_body(timeout=60)
            await stream.close()
        else:
            raise AssertionError("the worker finished the line before every stop")
        doomed.kill()
        heir = start_worker(own_redis.url, tmp_path, name="heir", **env)
        try:
            got = await stream.read_body(timeout=90)
        finally:
            await stream.close()
        assert not got.complete, f"a line said twice ended as if whole ({len(got.body)} bytes)"
        assert got.ended in ("eof", "reset"), got.ended
        log = gateway.log_text()
        assert "restarted by another worker" in log and "(takes_differ); closing the connection" in log, log[-2000:]
    finally:
        await redis.aclose()
        gateway.stop()
        for worker in (doomed, heir):
            if worker is not None:
                if worker.alive():
                    os.kill(worker.pid, signal.SIGCONT)
                worker.stop()
