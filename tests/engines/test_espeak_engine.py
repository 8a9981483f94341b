"""EspeakEngine through libespeak-ng (espeakng-loader): English, Mandarin, Cantonese."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.support.audio import CLICK_RATIO, is_speech_like, max_jump, rms
from tests.support.engines import Synthesis, synthesize, voice_with
from voxroom.errors import EngineError
from voxroom.voices.catalog import Catalog
from workers.engines.base import Engine
from workers.engines.espeak import DEFAULT_RATE, EspeakEngine

ENGLISH = "The old lighthouse keeper climbed the stairs slowly every evening before dark."
# Werewolf-game lines of 17 and 18 characters (one syllable per character). Full-width punctuation
# on purpose: it is what Chinese text has, and espeak must pause on it.
MANDARIN = "天黑请闭眼，狼人请睁眼。今晚你们要杀谁？"  # noqa: RUF001
CANTONESE = "天黑請閉眼，狼人請睜眼。今晚你哋要殺邊個？"  # noqa: RUF001
# Plausible speaking rates. English: 120-300 words/min; espeak's default is 175 (~2.9 words/s).
# Mandarin and Cantonese: natural speech runs 4-6 syllables/s, espeak reads ~3-4; 2-7/s leaves
# room for pauses at punctuation. Mandarin spelled out as "Chinese letter" (the voice pitfall)
# runs ~1.5 characters/s and falls below the range.
WORDS_PER_S = (2.0, 5.0)
SYLLABLES_PER_S = (2.0, 7.0)


def _cjk_count(text: str) -> int:
    return sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff")


def _assert_speech(out: Synthesis) -> None:
    assert rms(out.audio) > 0.03, rms(out.audio)
    verdict = is_speech_like(out.audio, out.rate)
    assert verdict, verdict.reason


def test_is_an_engine(espeak: EspeakEngine) -> None:
    assert isinstance(espeak, Engine)
    assert espeak.sample_rate == 22_050 and espeak.max_batch == 1


def test_english(espeak: EspeakEngine, catalog: Catalog) -> None:
    out = synthesize(espeak, catalog.get("en-espeak"), ENGLISH)
    words = len(ENGLISH.split())
    assert words / WORDS_PER_S[1] <= out.seconds <= words / WORDS_PER_S[0], out.seconds
    _assert_speech(out)


@pytest.mark.parametrize(("voice_id", "text"), [("cmn-espeak", MANDARIN), ("yue-espeak", CANTONESE)])
def test_chinese(espeak: EspeakEngine, catalog: Catalog, voice_id: str, text: str) -> None:
    # At espeak-ng's own rate: the catalog's Mandarin voices are tuned slower (docs/voices.md).
    out = synthesize(espeak, voice_with(catalog.get(voice_id), rate=DEFAULT_RATE), text)
    syllables = _cjk_count(text)
    assert syllables >= 17
    low, high = syllables / SYLLABLES_PER_S[1], syllables / SYLLABLES_PER_S[0]
    assert low <= out.seconds <= high, f"{out.seconds:.2f} s for {syllables} characters"
    _assert_speech(out)


def test_mandarin_is_read_not_spelled(espeak: EspeakEngine, catalog: Catalog) -> None:
    """An English voice reads each character as "Chinese letter": over twice as long."""
    mandarin = synthesize(espeak, voice_with(catalog.get("cmn-espeak"), rate=DEFAULT_RATE), MANDARIN)
    spelled = synthesize(espeak, catalog.get("en-espeak"), MANDARIN)
    assert spelled.seconds > 2 * mandarin.seconds, (spelled.seconds, mandarin.seconds)


def test_streams_in_100ms_chunks(espeak: EspeakEngine, catalog: Catalog) -> None:
    out = synthesize(espeak, catalog.get("cmn-espeak"), MANDARIN)
    sizes = [c.size / out.rate for c in out.chunks]
    assert len(sizes) >= 20
    # One buffer per callback, 100 ms each; espeak flushes a shorter one at each clause's end.
    assert max(sizes) <= 0.101, sizes
    assert sum(1 for s in sizes if s >= 0.099) >= 0.8 * len(sizes), sizes
    assert out.arrivals_s[0] < out.total_s
    # The buffers are consecutive pieces of one signal: joined, they do not click.
    joins = np.cumsum([c.size for c in out.chunks[:-1]]) - 1
    assert max_jump(out.audio, out.rate, at=joins) < CLICK_RATIO


def test_lock_serialises_threads(catalog: Catalog) -> None:
    """Two engines in two threads share libespeak-ng's globals; the lock keeps each utterance
    intact. espeak jitters a few samples run to run, so compare lengths within 0.5 %: audio
    mixed between the two utterances (or a voice switched mid-way) would be far off."""
    engines = [EspeakEngine(), EspeakEngine()]
    for engine in engines:
        engine.load("cpu")
    jobs = [(catalog.get("en-espeak"), ENGLISH), (catalog.get("cmn-espeak"), MANDARIN)]
    serial = [synthesize(e, v, t).audio for e, (v, t) in zip(engines, jobs, strict=True)]
    results: list[list[np.ndarray]] = [[], []]

    def run(i: int) -> None:
        for _ in range(5):
            results[i].append(synthesize(engines[i], *jobs[i]).audio)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    for i in range(2):
        assert len(results[i]) == 5
        for audio in results[i]:
            assert abs(audio.size - serial[i].size) <= 0.005 * serial[i].size
            assert is_speech_like(audio, 22_050)


def test_cancel_stops_early(espeak: EspeakEngine, catalog: Catalog) -> None:
    full = synthesize(espeak, catalog.get("en-espeak"), ENGLISH)
    cut = synthesize(espeak, catalog.get("en-espeak"), ENGLISH, cancel_after=3)
    assert len(cut.chunks) == 3
    assert cut.seconds < 0.2 * full.seconds
    # The aborted synthesis released the library: the next one is whole.
    again = synthesize(espeak, catalog.get("en-espeak"), ENGLISH)
    assert abs(again.audio.size - full.audio.size) <= 0.005 * full.audio.size


def test_dropped_generator_releases_the_library(espeak: EspeakEngine, catalog: Catalog) -> None:
    from workers.engines.base import SynthesisRequest

    stream = espeak.stream(SynthesisRequest(ENGLISH, catalog.get("en-espeak")), threading.Event())
    first = next(stream)
    assert first.size > 0
    stream.close()
    _assert_speech(synthesize(espeak, catalog.get("cmn-espeak"), MANDARIN))


def test_rate_param(espeak: EspeakEngine, catalog: Catalog) -> None:
    normal = synthesize(espeak, catalog.get("en-espeak"), ENGLISH)
    fast = synthesize(espeak, voice_with(catalog.get("en-espeak"), rate=350), ENGLISH)
    assert fast.seconds < 0.75 * normal.seconds
    _assert_speech(fast)
    with pytest.raises(EngineError, match="rate"):
        synthesize(espeak, voice_with(catalog.get("en-espeak"), rate=5000), ENGLISH)


@pytest.mark.parametrize("voice", ["xx-nope", "../../etc/passwd", "", 7])
def test_unknown_voice_raises(espeak: EspeakEngine, catalog: Catalog, voice: object) -> None:
    with pytest.raises(EngineError, match="espeak voice"):
        synthesize(espeak, voice_with(catalog.get("cmn-espeak"), voice=voice), MANDARIN)
    # A failed voice change leaves no trace: Mandarin is still read as Mandarin.
    out = synthesize(espeak, voice_with(catalog.get("cmn-espeak"), rate=DEFAULT_RATE), MANDARIN)
    assert out.seconds <= _cjk_count(MANDARIN) / SYLLABLES_PER_S[0]
    _assert_speech(out)


def test_stream_before_load_raises(catalog: Catalog) -> None:
    with pytest.raises(EngineError, match="before load"):
        synthesize(EspeakEngine(), catalog.get("en-espeak"), ENGLISH)
