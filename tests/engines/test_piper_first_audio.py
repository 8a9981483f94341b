"""Piper's first piece (workers/engines/piper/pieces.py): a long first sentence is cut after its
first phrase, so that the first chunk is that phrase's audio; the pieces join without a click, a
jump in loudness or a lost word, and word marks stay where the words sound."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.engines.test_marks import PIPER_TOLERANCE_MS, check_marks, check_onsets
from tests.support.audio import CLICK_RATIO, dbfs, frame_rms, is_speech_like, max_jump, rms
from tests.support.engines import synthesize
from tests.support.marks_check import run_timed
from voxroom.voices.catalog import Catalog
from workers.engines.base import SynthesisRequest
from workers.engines.piper.engine import PiperEngine
from workers.engines.piper.pieces import plan
from workers.engines.piper.threads import running
from workers.engines.wrappers import NarratorEngine

LINE = "The werewolves wake up, look at each other, and silently choose a victim. Then they sleep."
HEAD = ["The", "werewolves", "wake", "up"]
"""The first phrase: four of the first sentence's thirteen words."""
QUIET_DBFS = -40.0


@pytest.fixture(scope="module")
def uncut() -> PiperEngine:
    engine = PiperEngine(first_piece_words=0)
    engine.load("cpu")
    return engine


# -- pure ----------------------------------------------------------------------------------------


def test_the_first_sentence_is_cut_after_its_first_long_enough_phrase() -> None:
    sentence = list("ðə wˈɛɹwʊlvz wˈeɪk ˈʌp, lˈʊk æt ˈiːtʃ ˈʌðɚ, ænd tʃˈuːz.")
    later = list("ðɛn ðeɪ slˈiːp, æt lˈæst.")
    pieces, cut = plan([sentence, later])
    assert cut
    assert ["".join(p) for p in pieces] == ["ðə wˈɛɹwʊlvz wˈeɪk ˈʌp,", "lˈʊk æt ˈiːtʃ ˈʌðɚ, ænd tʃˈuːz.",
                                            "ðɛn ðeɪ slˈiːp, æt lˈæst."]  # only the first sentence
    # A phrase under three words is passed over for the next phrase end.
    pieces, cut = plan([list("jˈɛs, ðə wˈʊlvz wˈeɪk ˈʌp; ænd tʃˈuːz ɐ vˈɪktɪm.")])
    assert cut and "".join(pieces[0]) == "jˈɛs, ðə wˈʊlvz wˈeɪk ˈʌp;"
    # No phrase end, too little after it, or cutting turned off: the sentences as they were.
    for sentences, words in (([list("ðə sˈiəɹ ˈoʊpənz hɜː ˈaɪz.")], 3), ([list("ðə sˈiəɹ ˈoʊpənz, ˈaɪz.")], 3),
                             ([sentence], 0), ([], 3)):
        assert plan(sentences, words) == (sentences, False)


# -- real audio ----------------------------------------------------------------------------------


def test_the_first_chunk_is_the_first_phrase(piper: PiperEngine, uncut: PiperEngine, catalog: Catalog) -> None:
    voice = catalog.get("en-joe")
    cut = synthesize(piper, voice, LINE)
    whole = synthesize(uncut, voice, LINE)
    assert len(cut.chunks) == 3 and len(whole.chunks) == 2
    first, sentence = cut.chunks[0].size / cut.rate, whole.chunks[0].size / whole.rate
    # Four words of thirteen (padding included: a little more than their share).
    assert 0.15 * sentence < first < 0.5 * sentence, (first, sentence)
    assert is_speech_like(cut.chunks[0], cut.rate, min_seconds=0.5)
    # Nothing lost or repeated: the cut sentence lasts as long as the sentence read whole, to
    # the model's own variation (its durations are sampled) and the pause at the cut.
    cut_sentence = (cut.chunks[0].size + cut.chunks[1].size) / cut.rate
    assert 0.85 * sentence < cut_sentence < 1.15 * sentence, (cut_sentence, sentence)
    # The cut is the first sentence's only change.
    assert abs(cut.chunks[2].size - whole.chunks[1].size) < 0.25 * whole.chunks[1].size


def test_the_pieces_join_in_silence_without_a_click_or_a_jump_in_loudness(piper: PiperEngine,
                                                                          catalog: Catalog) -> None:
    out = synthesize(piper, catalog.get("en-joe"), LINE)
    head, rest = out.chunks[0], out.chunks[1]
    join = head.size
    assert max_jump(out.audio, out.rate, at=[join - 1]) < CLICK_RATIO
    # Both sides of the join are quiet (each run ends and starts in its own padding) for about a
    # comma's pause: what the model leaves at that comma inside the sentence is 290-400 ms.
    env = frame_rms(out.audio, out.rate)  # one value per 10 ms
    loud = env > 10 ** (QUIET_DBFS / 20)
    at = join // (out.rate // 100)
    before = at - int(np.flatnonzero(loud[:at])[-1])
    after = int(np.flatnonzero(loud[at:])[0])
    assert 15 <= before + after <= 60, (before, after)  # 150-600 ms of silence across the cut
    # The rest of the sentence keeps the first phrase's gain: their voiced loudness is alike
    # (piper's own per-run peak scaling would let it jump).
    def voiced(x: np.ndarray) -> float:
        e = frame_rms(x, out.rate)
        return dbfs(rms(e[e > 10 ** (QUIET_DBFS / 20)]))
    assert abs(voiced(head) - voiced(rest)) < 6.0, (voiced(head), voiced(rest))
    assert float(np.abs(out.audio).max()) <= 1.0
    verdict = is_speech_like(out.audio, out.rate)
    assert verdict, verdict.reason


def test_word_marks_put_the_first_phrase_in_the_first_chunk(piper: PiperEngine, catalog: Catalog) -> None:
    voice = catalog.get("en-joe")
    items = list(piper.stream_timed(SynthesisRequest(text=LINE, voice=voice), threading.Event()))
    assert isinstance(items[0], list) and not isinstance(items[1], list)
    assert [m.text for m in items[0]] == HEAD
    first_s = items[1].size / piper.sample_rate
    assert items[0][-1].end_ms <= first_s * 1000 + 1  # the phrase's words lie in the first chunk
    rest = [m for item in items[2:] if isinstance(item, list) for m in item]
    assert rest[0].text == "look" and rest[0].start_ms >= first_s * 1000
    for text in (LINE, "Dawn breaks over the quiet village; one of you did not survive the night.",
                 "The votes are in: seven for Paul, three for Anne, and one for Jules."):
        timed = run_timed(NarratorEngine(piper), voice, text)
        check_marks(timed)
        check_onsets(timed, PIPER_TOLERANCE_MS)


def test_cancel_after_the_first_phrase_stops_there(piper: PiperEngine, catalog: Catalog) -> None:
    cut = synthesize(piper, catalog.get("en-joe"), LINE, cancel_after=1)
    assert len(cut.chunks) == 1
    assert is_speech_like(cut.audio, cut.rate, min_seconds=0.5)


def test_streams_running_together_are_counted_and_each_stays_whole(piper: PiperEngine, uncut: PiperEngine,
                                                                   catalog: Catalog) -> None:
    # A piece starts on the two-thread session only while its stream runs alone
    # (workers/engines/piper/threads.py); the count must follow streams opened and closed.
    voice = catalog.get("en-joe")
    assert running() == 0
    a = piper.stream(SynthesisRequest(text=LINE, voice=voice), threading.Event())
    b = uncut.stream(SynthesisRequest(text=LINE, voice=voice), threading.Event())
    got_a, got_b = [next(a)], [next(b)]
    assert running() == 2
    got_a += list(a)
    assert running() == 1
    got_b += list(b)
    assert running() == 0
    assert len(got_a) == 3 and len(got_b) == 2
    for chunks in (got_a, got_b):
        verdict = is_speech_like(np.concatenate(chunks), piper.sample_rate)
        assert verdict, verdict.reason
    cancelled = piper.stream(SynthesisRequest(text=LINE, voice=voice), threading.Event())
    next(cancelled)
    cancelled.close()  # a stream dropped half way (a cancelled line) stops counting at once
    assert running() == 0
