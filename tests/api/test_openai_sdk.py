"""The official ``openai`` package against a real gateway and worker, as OpenAI's users call it."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest

from app.api.openai_compat import MODELS
from tests.api.test_speech_api import decode
from tests.conftest import Stack
from tests.support.audio import is_speech_like
from tests.support.processes import start_gateway
from voxroom.wire.protocol import ROOM_RATE

LINE = "Good evening, villagers. Tonight the werewolves will choose their victim."


def client(port: int, **kwargs: object) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused-with-insecure-dev",
                         timeout=60, **kwargs)  # type: ignore[arg-type]


def decoded_seconds(data: bytes, *, speech: bool = True) -> float:
    audio = decode(data)  # at the room rate
    if speech:
        verdict = is_speech_like(audio, ROOM_RATE)
        assert verdict, verdict.reason
    return float(audio.size / ROOM_RATE)


def test_models_list_and_retrieve(stack: Stack) -> None:
    with client(stack.port) as sdk:
        assert [m.id for m in sdk.models.list()] == list(MODELS)
        assert sdk.models.retrieve("tts-1").id == "tts-1"
        with pytest.raises(openai.NotFoundError) as caught:
            sdk.models.retrieve("dall-e-3")
        assert caught.value.code == "model_not_found"


def test_speech_create_and_streaming_in_several_formats(stack: Stack, tmp_path: Path) -> None:
    with client(stack.port) as sdk:
        wav = sdk.audio.speech.create(model="tts-1", voice="marin", input=LINE, response_format="wav")
        reference = decoded_seconds(wav.content)
        assert 2.0 < reference < 10.0
        for fmt in ("mp3", "opus", "flac", "aac", "wav"):
            target = tmp_path / f"line.{fmt}"
            with sdk.audio.speech.with_streaming_response.create(
                    model="gpt-4o-mini-tts", voice="marin", input=LINE, response_format=fmt) as resp:
                assert resp.status_code == 200
                resp.stream_to_file(target)
            assert abs(decoded_seconds(target.read_bytes()) - reference) < 0.6, fmt
        # cedar is the offline catalog's Piper voice (whose tiny test model the speech check calls tonal).
        cedar = sdk.audio.speech.create(model="tts-1-hd", voice="cedar", input=LINE, response_format="mp3")
        assert 2.0 < decoded_seconds(cedar.content, speech=False) < 10.0
        fast = sdk.audio.speech.create(model="tts-1", voice="marin", input=LINE, response_format="wav", speed=2.0)
        assert 0.4 < decoded_seconds(fast.content) / reference < 0.6


def test_errors_are_the_sdks_typed_exceptions(stack: Stack, tmp_path: Path) -> None:
    with client(stack.port, max_retries=0) as sdk:
        with pytest.raises(openai.BadRequestError) as bad:
            sdk.audio.speech.create(model="tts-1", voice="no-such-voice", input="Hi.")
        assert bad.value.code == "unknown_voice" and bad.value.param == "voice"
        with pytest.raises(openai.BadRequestError) as mixed:
            sdk.audio.speech.create(model="tts-1", voice="alloy+nova", input="Hi.")
        assert mixed.value.code == "voice_mix_unsupported"
        with pytest.raises(openai.BadRequestError) as long:
            sdk.audio.speech.create(model="tts-1", voice="alloy", input="x" * 4097)
        assert long.value.code == "text_too_long"
    gateway, port = start_gateway(stack.redis_url, tmp_path, VOXROOM_SPEECH_MAX_STREAMS="0")
    try:
        with client(port, max_retries=1) as sdk, pytest.raises(openai.InternalServerError) as busy:
            sdk.audio.speech.create(model="tts-1", voice="alloy", input="Hi.")
        assert busy.value.status_code == 503 and busy.value.code == "busy"
        assert busy.value.response.headers["retry-after"] == "1"
        # The SDK retried once, after the Retry-After it was given: two requests reached the gateway.
        assert gateway.log_text().count("refusing another") == 2
    finally:
        gateway.stop()
