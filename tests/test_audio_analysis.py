"""The audio helpers tell real speech (Piper, espeak-ng) from silence, tones, noise and clicks."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pytest

from tests.support.audio import (
    CLICK_RATIO,
    SILENCE_DBFS,
    dbfs,
    duration_s,
    frame_rms,
    is_speech_like,
    max_jump,
    rms,
    spectral_flatness,
    syllable_modulation,
    voiced_duration_s,
    zero_crossing_rate,
)
from voxroom.voices.catalog import Catalog
from workers.engines.base import Engine, SynthesisRequest
from workers.engines.espeak import EspeakEngine
from workers.engines.piper.engine import PiperEngine

RATE = 22_050
Audio = npt.NDArray[np.float32]
SPEECH = {
    "en-joe": "The old lighthouse keeper climbed the stairs slowly every evening before dark.",
    "en-espeak": "The old lighthouse keeper climbed the stairs slowly every evening before dark.",
    "cmn-espeak": "天黑请闭眼，狼人请睁眼。今晚你们要杀谁？",  # noqa: RUF001 (Chinese punctuation)
    "yue-espeak": "天黑請閉眼，狼人請睜眼。今晚你哋要殺邊個？",  # noqa: RUF001
}


def _speak(engine: Engine, voice_id: str) -> Audio:
    voice = Catalog.load().get(voice_id)
    return np.concatenate(list(engine.stream(SynthesisRequest(SPEECH[voice_id], voice),
                                             threading.Event())))


@pytest.fixture(scope="module")
def speech() -> Iterator[dict[str, Audio]]:
    piper, espeak = PiperEngine(), EspeakEngine()
    piper.load("cpu")
    espeak.load("cpu")
    samples = {v: _speak(piper if v == "en-joe" else espeak, v) for v in SPEECH}
    yield samples
    piper.close()
    espeak.close()


def _t(seconds: float = 3.0) -> npt.NDArray[np.float64]:
    return np.arange(int(seconds * RATE)) / RATE


def _sine(freq: float = 440.0, amp: float = 0.5) -> Audio:
    return (amp * np.sin(2 * np.pi * freq * _t())).astype(np.float32)


def _noise(amp: float = 0.3) -> Audio:
    return (amp * np.random.default_rng(7).standard_normal(_t().size)).astype(np.float32)


def _syllable_envelope() -> npt.NDArray[np.float64]:
    return 0.5 - 0.5 * np.cos(2 * np.pi * 4.0 * _t())  # opens and closes 4 times a second


@pytest.mark.parametrize("voice_id", sorted(SPEECH))
def test_real_speech_is_speech_like(speech: dict[str, Audio], voice_id: str) -> None:
    audio = speech[voice_id]
    verdict = is_speech_like(audio, RATE)
    assert verdict, verdict.reason
    assert verdict.reason.startswith("speech-like")
    assert 1e-3 < spectral_flatness(audio) < 0.1
    assert syllable_modulation(audio, RATE) > 0.4
    assert max_jump(audio, RATE) < CLICK_RATIO
    assert 2.0 < duration_s(audio, RATE) < 10.0  # cmn-espeak is tuned slow: 8.9 s
    assert 0.8 * duration_s(audio, RATE) < voiced_duration_s(audio, RATE) <= duration_s(audio, RATE)


@pytest.mark.parametrize(("name", "audio", "why"), [
    ("digital silence", np.zeros(3 * RATE, np.float32), "silence"),
    ("hiss at -80 dBFS", _noise(1e-4), "silence"),
    ("sine 440 Hz", _sine(), "tone-like spectrum"),
    ("sine 150 Hz (a speech pitch)", _sine(150.0), "tone-like spectrum"),
    ("sine pulsed at syllable rate", (_sine() * _syllable_envelope()).astype(np.float32), "tone-like"),
    ("white noise", _noise(), "noise-like spectrum"),
    ("white noise pulsed at syllable rate", (_noise() * _syllable_envelope()).astype(np.float32), "noise"),
    ("too short", _sine()[:RATE // 10], "too short"),
])
def test_non_speech_is_rejected(name: str, audio: Audio, why: str) -> None:
    verdict = is_speech_like(audio, RATE)
    assert not verdict, f"{name}: {verdict.reason}"
    assert verdict.reason.startswith(why), verdict.reason


def test_steady_harmonic_buzz_lacks_syllables() -> None:
    """A buzz with a speech-like spectrum but no syllables fails on modulation alone."""
    phase = 2 * np.pi * 120.0 * _t()
    buzz = (0.2 * sum(np.sin(k * phase) / k for k in range(1, 30))).astype(np.float32)
    buzz = buzz + _noise(0.01)
    verdict = is_speech_like(buzz, RATE)
    assert not verdict and verdict.reason.startswith("no syllable-rate modulation"), verdict.reason


def test_levels() -> None:
    assert rms(np.zeros(10, np.float32)) == 0.0 and rms(np.zeros(0, np.float32)) == 0.0
    assert rms(_sine(amp=1.0)) == pytest.approx(1 / np.sqrt(2), rel=1e-3)
    assert dbfs(rms(_sine(amp=1.0))) == pytest.approx(-3.01, abs=0.01)
    assert dbfs(0.0) == float("-inf") and dbfs(rms(_noise(1e-4))) < SILENCE_DBFS
    assert frame_rms(_sine(amp=1.0), RATE).shape == (299,)
    assert zero_crossing_rate(_sine(440.0), RATE) == pytest.approx(880, rel=0.01)
    with pytest.raises(ValueError, match="mono"):
        rms(np.zeros((2, 10), np.float32))


def test_voiced_duration_ignores_surrounding_silence(speech: dict[str, Audio]) -> None:
    audio = speech["en-joe"]
    padded = np.concatenate([np.zeros(RATE, np.float32), audio, np.zeros(2 * RATE, np.float32)])
    assert duration_s(padded, RATE) == pytest.approx(duration_s(audio, RATE) + 3.0)
    assert voiced_duration_s(padded, RATE) == pytest.approx(voiced_duration_s(audio, RATE), abs=0.02)


@pytest.mark.parametrize("voice_id", sorted(SPEECH))
def test_click_detector_finds_a_dropout_in_speech(speech: dict[str, Audio], voice_id: str) -> None:
    audio = speech[voice_id].copy()
    loudest = int(np.argmax(np.abs(audio)))
    audio[loudest + 1:loudest + 221] = 0.0  # 10 ms of audio lost right after a peak
    assert max_jump(audio, RATE) > CLICK_RATIO
    assert max_jump(audio, RATE, at=[loudest]) > CLICK_RATIO


def test_click_detector_on_tones_and_noise() -> None:
    clean = _sine()
    assert max_jump(clean, RATE) < 2.0
    assert max_jump(_noise(), RATE) < 6.0
    t = _t()
    flip_at = 660.25 / 440  # a crest of the 440 Hz sine: inverting it there steps by 2 x 0.5
    jumped = (0.5 * np.sin(2 * np.pi * 440 * t + np.pi * (t >= flip_at))).astype(np.float32)
    join = int(np.argmax(t >= flip_at)) - 1
    assert max_jump(jumped, RATE) > CLICK_RATIO
    assert max_jump(jumped, RATE, at=[join]) > CLICK_RATIO
    assert max_jump(jumped, RATE, at=[join - 500, join + 500]) < 2.0
