"""Server-side sentence splitting (pure Python)."""

from __future__ import annotations

import re

from voxroom.voices.text_split import split_for_transition, split_text


def _chars(s: str) -> str:
    return re.sub(r"\s+", "", s)


def test_english_and_chinese_sentences() -> None:
    text = "Hello there, my friend. How are you today? 你好，朋友。今天天气怎么样？我很好！"
    pieces = split_text(text, max_chars=30)
    assert all(len(p) <= 30 for p in pieces)
    assert _chars("".join(pieces)) == _chars(text)
    assert pieces[0].endswith("friend.") and any("怎么样？" in p for p in pieces)


def test_long_sentence_cut_at_commas_then_spaces_then_hard() -> None:
    clauses = ", ".join(["this clause has some words in it"] * 10) + "."
    pieces = split_text(clauses)
    assert len(pieces) > 1 and all(len(p) <= 120 for p in pieces)
    assert all(p.endswith((",", ".")) for p in pieces)
    chinese = "这是一个没有标点的很长的句子" * 20
    pieces = split_text(chinese)
    assert all(len(p) <= 120 for p in pieces) and "".join(pieces) == chinese
    words = " ".join(["word"] * 100)
    assert all(len(p) <= 120 and not p.startswith(" ") for p in split_text(words))


def test_short_pieces_are_merged_and_blank_dropped() -> None:
    assert split_text("Yes. No. Maybe so, said the man.") == ["Yes. No. Maybe so, said the man."]
    assert split_text("   \n  ") == []


def test_split_for_transition_makes_enough_pieces() -> None:
    pieces = split_for_transition(["First part here, second part there, third part, and the fourth one."], 4)
    assert len(pieces) == 4
    assert split_for_transition(["Too short."], 5) == ["Too short."]
