"""PiperEngine on the bundled en_US-joe-medium voice: real audio, real timings."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.support.audio import CLICK_RATIO, is_speech_like, max_jump, rms, voiced_duration_s
from tests.support.engines import synthesize, voice_with
from voxroom.errors import EngineError
from voxroom.voices.catalog import Catalog
from workers.engines.base import Engine
from workers.engines.piper.engine import PiperEngine

# 12 words. English speech runs at 120-240 words a minute (2-4 words/s); Piper's joe voice
# reads at about 3 words/s. Allowing 2-5 words/s covers a slow narrator and a fast reading while
# still catching audio that is truncated (too short) or padded / looping (too long).
SENTENCE = "The old lighthouse keeper climbed the stairs slowly every evening before dark."
WORDS_PER_S = (2.0, 5.0)
STORY = ("Night falls over the village. Everyone closes their eyes. "
         "The wolves wake up and choose a victim. Then the seer opens her eyes.")


def test_is_an_engine(piper: PiperEngine) -> None:
    assert isinstance(piper, Engine)
    assert piper.sample_rate == 22_050 and piper.max_batch == 1


def test_sentence_is_speech_of_plausible_length(piper: PiperEngine, catalog: Catalog) -> None:
    out = synthesize(piper, catalog.get("en-joe"), SENTENCE)
    words = len(SENTENCE.split())
    assert words == 12
    low, high = words / WORDS_PER_S[1], words / WORDS_PER_S[0]
    assert low <= out.seconds <= high, f"{out.seconds:.2f} s for {words} words"
    assert voiced_duration_s(out.audio, out.rate) >= 0.8 * low
    assert rms(out.audio) > 0.03  # about -30 dBFS; Piper normalises each sentence to full peak
    assert float(abs(out.audio).max()) <= 1.0
    verdict = is_speech_like(out.audio, out.rate)
    assert verdict, verdict.reason


def test_one_chunk_per_sentence_and_first_chunk_early(piper: PiperEngine, catalog: Catalog) -> None:
    out = synthesize(piper, catalog.get("en-joe"), STORY)
    assert len(out.chunks) == 4
    assert all(is_speech_like(c, out.rate, min_seconds=0.3) for c in out.chunks)
    # The first sentence is handed over before the others are synthesized: counted in this
    # process's CPU time, which a busy machine's other processes do not stretch.
    assert out.cpu_arrivals_s[0] < 0.6 * out.cpu_total_s, (out.cpu_arrivals_s, out.cpu_total_s)
    # Sentences start and end in silence, so played back to back they join without a click.
    joins = np.cumsum([c.size for c in out.chunks[:-1]]) - 1
    assert max_jump(out.audio, out.rate, at=joins) < CLICK_RATIO


def test_cancel_stops_between_sentences(piper: PiperEngine, catalog: Catalog) -> None:
    full = synthesize(piper, catalog.get("en-joe"), STORY)
    cut = synthesize(piper, catalog.get("en-joe"), STORY, cancel_after=1)
    assert len(cut.chunks) == 1
    assert cut.seconds < 0.5 * full.seconds
    assert is_speech_like(cut.audio, cut.rate, min_seconds=0.3)


def test_cancel_before_start_yields_nothing(piper: PiperEngine, catalog: Catalog) -> None:
    cancel = threading.Event()
    cancel.set()
    out = synthesize(piper, catalog.get("en-joe"), STORY, cancel=cancel)
    assert out.chunks == []


def test_length_scale_is_passed_through(piper: PiperEngine, catalog: Catalog) -> None:
    normal = synthesize(piper, catalog.get("en-joe"), SENTENCE)
    slow = synthesize(piper, voice_with(catalog.get("en-joe"), length_scale=1.6), SENTENCE)
    assert slow.seconds > 1.35 * normal.seconds, (slow.seconds, normal.seconds)
    assert is_speech_like(slow.audio, slow.rate)


def test_unknown_model_raises(piper: PiperEngine, catalog: Catalog) -> None:
    with pytest.raises(EngineError, match="unknown piper model 'no-such-voice'"):
        synthesize(piper, voice_with(catalog.get("en-joe"), model="no-such-voice"), SENTENCE)
    with pytest.raises(EngineError, match="unknown piper model"):
        PiperEngine(models=("no-such-voice",))
    # The engine still speaks after refusing a request.
    assert is_speech_like(synthesize(piper, catalog.get("en-joe"), SENTENCE).audio, 22_050)


def test_bad_param_raises(piper: PiperEngine, catalog: Catalog) -> None:
    with pytest.raises(EngineError, match="length_scale"):
        synthesize(piper, voice_with(catalog.get("en-joe"), length_scale=50), SENTENCE)
