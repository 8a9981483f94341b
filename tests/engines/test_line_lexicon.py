"""A line's own lexicon (``say``'s ``lexicon``) over the deployment's: matching, what it does to
a real engine's audio and word marks, and the cache key it gives the line."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from voxroom.voices.catalog import Catalog
from workers.audio_cache.cache import fingerprint
from workers.engines.base import Engine, SynthesisRequest
from workers.engines.espeak import EspeakEngine
from workers.engines.lexicon import Lexicon, for_line
from workers.engines.marks import WordMark
from workers.engines.wrappers import NarratorEngine, RewritingEngine
from workers.pool.cache_race import fingerprint_of

DEPLOYMENT = Lexicon.from_text("seer\tseeer\nWerewolf King\tthe wolf king\nLupin\tLoo pan\tespeak=l'u:p@n\n"
                               "重庆\t虫庆\n")


def respell(text: str, line: dict[str, str], deployment: Lexicon | None = DEPLOYMENT) -> str:
    base = deployment if deployment is not None else Lexicon(())
    return base.apply_spans(text, "espeak", override=for_line(tuple(sorted(line.items()))))[0]


def test_the_lines_entry_wins_over_the_deployments_for_the_same_words() -> None:
    assert respell("The Seer wakes.", {"seer": "sear"}) == "The sear wakes."
    # A capital key matches only as written, and there it still wins over the any-case entry.
    assert respell("The Seer and the seer.", {"Seer": "Sir"}) == "The Sir and the seeer."
    # A respelling beats the deployment's phonemes for this engine.
    assert respell("Lupin wakes.", {"Lupin": "Loo peen"}) == "Loo peen wakes."
    assert respell("Lupin wakes.", {}) == "[[l'u:p@n]] wakes."


def test_longest_match_first_across_both_lexicons() -> None:
    # The deployment's phrase is longer than the line's word: the phrase wins where it is written,
    line = {"werewolf": "wolf man"}
    assert respell("The Werewolf King and a werewolf.", line) == "The the wolf king and a wolf man."
    # and the line's phrase beats the deployment's shorter word inside it.
    assert respell("Ask the seer's mother, seer.", {"seer's mother": "Martha"}) == "Ask the Martha, seeer."


def test_the_rules_of_the_file_hold_for_the_line() -> None:
    assert respell("NASA and nasa", {"NASA": "Nasa"}, None) == "Nasa and nasa"  # case-aware
    assert respell("GM, gm, Gm", {"gm": "game master"}, None) == "game master, game master, game master"
    assert respell("Seers see overseers.", {"seer": "X"}, None) == "Seers see overseers."  # whole words
    assert respell("你是NPC吗？我在重庆。", {"NPC": "恩皮西"}) == "你是恩皮西吗？我在虫庆。"
    assert respell("去重庆吧", {"重庆": "崇庆"}) == "去崇庆吧"  # Chinese anywhere, the line's entry first
    assert respell("The  Werewolf\n King", {"Werewolf King": "W K"}, None) == "The  W K"


def test_a_line_without_entries_is_the_deployments_alone() -> None:
    assert for_line(()) is None
    text = "The Seer meets Lupin in 重庆."
    assert DEPLOYMENT.apply_spans(text, "piper", override=None) == DEPLOYMENT.apply_spans(text, "piper")


def run(engine: NarratorEngine | RewritingEngine, request: SynthesisRequest) -> tuple[np.ndarray, list[WordMark]]:
    chunks: list[np.ndarray] = []
    marks: list[WordMark] = []
    stream = (engine.stream_timed(request, threading.Event()) if isinstance(engine, NarratorEngine)
              else engine.stream(request, threading.Event()))
    for item in stream:
        if isinstance(item, list):
            marks.extend(item)
        else:
            chunks.append(item)
    return np.concatenate(chunks), marks


@pytest.mark.parametrize("wrapper", [NarratorEngine, RewritingEngine])
def test_espeak_says_the_lines_respelling_and_marks_name_the_words_as_written(
        catalog: Catalog, espeak: EspeakEngine, wrapper: type[NarratorEngine] | type[RewritingEngine]) -> None:
    engine = wrapper(espeak, lexicon=DEPLOYMENT)
    text = "The GM wakes. [pause:300] Seer, go."
    plain = SynthesisRequest(text=text, voice=catalog.get("en-espeak"))
    line = SynthesisRequest(text=text, voice=catalog.get("en-espeak"), lexicon=(("GM", "game master of the village"),))
    plain_audio, _ = run(engine, plain)
    line_audio, marks = run(engine, line)
    # espeak-ng's audio is not the same twice, but a respelling six syllables longer is heard.
    assert line_audio.size / engine.sample_rate - plain_audio.size / engine.sample_rate >= 0.4
    if wrapper is NarratorEngine:
        assert [(m.text, m.offset) for m in marks] == [("The", 0), ("GM", 4), ("wakes", 7), ("Seer", 26), ("go", 32)]
        starts = [m.start_ms for m in marks]
        assert starts == sorted(starts)


def test_the_line_lexicon_is_part_of_the_cache_key(catalog: Catalog, espeak: EspeakEngine) -> None:
    engine: Engine = NarratorEngine(espeak, lexicon=DEPLOYMENT)
    voice = catalog.get("en-espeak")
    plain = SynthesisRequest(text="The GM wakes.", voice=voice)
    keys = {fingerprint_of(engine, plain)}
    for entries in [(("GM", "game master"),), (("GM", "gee em"),), (("GM", "game master"), ("wakes", "rises"))]:
        keys.add(fingerprint_of(engine, SynthesisRequest(text="The GM wakes.", voice=voice, lexicon=entries)))
    assert len(keys) == 4
    # A line without its own entries keeps the key it had before lines could carry them.
    assert fingerprint_of(engine, plain) == fingerprint(
        engine=engine.name, model_version=str(getattr(engine, "model_version", "")), engine_rate=engine.sample_rate,
        voice=voice, text="The GM wakes.")
