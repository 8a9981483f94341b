"""Captioned speech (``POST /v1/audio/speech/captioned``, and Kokoro-FastAPI's
``/dev/captioned_speech``) over a real gateway and worker: the same audio as ``/v1/audio/speech``,
with every word of the input timed on that audio, as one JSON object or as NDJSON lines."""

from __future__ import annotations

import base64
import io
import json
import wave
from typing import Any

import httpx
import numpy as np
import openai
import pytest

from app.api.speech_room import split_input
from tests.api.test_openai_sdk import client
from tests.api.test_speech_long_input import long_text
from tests.conftest import Stack
from voxroom.wire.protocol import ROOM_RATE
from workers.engines.marks import speech_bounds, split_words

LINE = "Good evening, villagers. Tonight the werewolves will choose their victim."
ONSET_TOLERANCE_S = 0.080
"""How far the first word's start may be from the audio's first sound (tests/e2e/test_marks_room.py)."""


def wav_samples(data: bytes) -> np.ndarray:
    with wave.open(io.BytesIO(data)) as wav:
        assert (wav.getnchannels(), wav.getsampwidth(), wav.getframerate()) == (1, 2, ROOM_RATE)
        frames = wav.readframes(wav.getnframes())
    return np.frombuffer(frames, dtype="<i2").astype(np.float64) / 32768


def captioned(sdk: openai.OpenAI, **body: object) -> dict[str, Any]:
    """The unstreamed answer, through the SDK's own request path (its errors, its retries)."""
    got = sdk.post("/audio/speech/captioned", body={"model": "tts-1", "stream": False, **body}, cast_to=object)
    assert isinstance(got, dict)
    return got


async def captioned_lines(stack: Stack, path: str = "/v1/audio/speech/captioned",
                          **body: object) -> list[dict[str, Any]]:
    """The streamed answer's NDJSON objects, in order."""
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=120) as http, \
            http.stream("POST", path, json=body) as resp:
        assert resp.status_code == 200, (await resp.aread())[:300]
        assert resp.headers["content-type"].startswith("application/json")
        return [json.loads(line) async for line in resp.aiter_lines() if line]


def check_words(stamps: list[dict[str, Any]], text: str, audio: np.ndarray) -> None:
    """Every word of ``text`` once, in order, placed in ``text`` by offset/length, monotone, within
    the audio; the first starts where the sound does."""
    assert [(s["word"], s["offset"], s["length"]) for s in stamps] == \
        [(w.text, w.offset, w.length) for w in split_words(text)]
    starts = [s["start_time"] for s in stamps]
    assert starts == sorted(starts)
    assert all(s["end_time"] >= s["start_time"] >= 0 for s in stamps)
    assert stamps[-1]["end_time"] <= audio.size / ROOM_RATE + 1e-3
    bounds = speech_bounds(audio, ROOM_RATE)
    assert bounds is not None
    assert abs(stamps[0]["start_time"] - bounds[0] / ROOM_RATE) <= ONSET_TOLERANCE_S, (stamps[0], bounds)


def check_words_lead(lines: list[dict[str, Any]]) -> None:
    """Each word of a ``pcm`` stream comes in the line that holds its start, or before it."""
    heard = 0.0
    for line in lines:
        assert all(s["start_time"] >= heard - 1e-3 for s in line["timestamps"]), "a word after its audio"
        heard += len(base64.b64decode(line["audio"])) / 2 / ROOM_RATE


@pytest.mark.parametrize("voice", ["en-espeak", "en-joe"])
async def test_the_audio_of_speech_with_every_word_timed(stack: Stack, voice: str) -> None:
    with client(stack.port) as sdk:
        plain = wav_samples(sdk.audio.speech.create(model="tts-1", voice=voice, input=LINE,
                                                    response_format="wav").content)
        whole = captioned(sdk, voice=voice, input=LINE, response_format="wav")
    assert whole["audio_format"] == "audio/wav"
    audio = wav_samples(base64.b64decode(whole["audio"]))
    assert abs(audio.size - plain.size) <= ROOM_RATE * 0.04, "the same audio as /v1/audio/speech"
    check_words(whole["timestamps"], LINE, audio)
    # Streamed (Kokoro-FastAPI's default), at its own path too: the pieces joined are the same
    # file, and each word comes before or with the piece that holds its start.
    lines = await captioned_lines(stack, "/dev/captioned_speech", voice=voice, input=LINE, response_format="pcm")
    assert lines and all(line["audio_format"] == "audio/pcm" for line in lines)
    check_words_lead(lines)
    streamed = np.frombuffer(b"".join(base64.b64decode(line["audio"]) for line in lines), dtype="<i2") / 32768
    assert streamed.size == audio.size
    stamps = [s for line in lines for s in line["timestamps"]]
    check_words(stamps, LINE, streamed)
    assert [s["start_time"] for s in stamps] == pytest.approx([s["start_time"] for s in whole["timestamps"]],
                                                              abs=2e-3)


async def test_a_long_input_is_timed_across_its_lines(stack: Stack) -> None:
    text = "  " + long_text(1200)  # leading blanks: offsets still index the input as sent
    assert len(split_input(text.strip())) >= 3
    lines = await captioned_lines(stack, voice="en-espeak", input=text, response_format="pcm")
    audio = np.frombuffer(b"".join(base64.b64decode(line["audio"]) for line in lines), dtype="<i2") / 32768
    stamps = [s for line in lines for s in line["timestamps"]]
    check_words(stamps, text, audio)
    assert len(lines) >= 3
    check_words_lead(lines)
    assert all(text[s["offset"]:s["offset"] + s["length"]] == s["word"] for s in stamps)
    # The last word ends near the end of the sound: the later lines are shifted by the audio before them.
    bounds = speech_bounds(audio, ROOM_RATE)
    assert bounds is not None
    assert abs(stamps[-1]["end_time"] - bounds[1] / ROOM_RATE) <= 0.5
    # And each word's span holds sound.
    voiced = [np.sqrt(np.mean(audio[int(s["start_time"] * ROOM_RATE):int(s["end_time"] * ROOM_RATE) + 1] ** 2))
              for s in stamps]
    assert np.mean(np.array(voiced) > 10 ** (-40 / 20)) >= 0.9


def test_speed_divides_the_times_and_timestamps_can_be_left_out(stack: Stack) -> None:
    with client(stack.port) as sdk:
        normal = captioned(sdk, voice="en-espeak", input=LINE, response_format="wav")
        fast = captioned(sdk, voice="en-espeak", input=LINE, response_format="wav", speed=2.0)
        bare = captioned(sdk, voice="en-espeak", input=LINE, response_format="wav", return_timestamps=False)
    assert [s["word"] for s in fast["timestamps"]] == [s["word"] for s in normal["timestamps"]]
    assert [s["start_time"] for s in fast["timestamps"]] == \
        pytest.approx([s["start_time"] / 2 for s in normal["timestamps"]], abs=2e-3)
    fast_audio = wav_samples(base64.b64decode(fast["audio"]))
    assert fast["timestamps"][-1]["end_time"] <= fast_audio.size / ROOM_RATE + 0.05
    assert bare["timestamps"] == [] and base64.b64decode(bare["audio"])[:4] == b"RIFF"


async def test_errors_have_openais_shape(stack: Stack) -> None:
    with client(stack.port, max_retries=0) as sdk:
        with pytest.raises(openai.BadRequestError) as unknown:
            captioned(sdk, voice="nobody-here", input=LINE)
        assert unknown.value.code == "unknown_voice"
        with pytest.raises(openai.BadRequestError) as fmt:
            captioned(sdk, voice="en-espeak", input=LINE, response_format="midi")
        assert fmt.value.code == "unsupported_format"
        with pytest.raises(openai.BadRequestError) as stream:
            captioned(sdk, voice="en-espeak", input=LINE, stream="yes")
        assert stream.value.code == "bad_message"
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=30) as http:
        resp = await http.post("/dev/captioned_speech", json={"voice": "nobody-here", "input": LINE})
    assert resp.status_code == 400
    assert resp.json()["error"]["code"] == "unknown_voice" and resp.json()["error"]["type"] == "invalid_request_error"
