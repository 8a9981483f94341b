"""An open line's text cut into clauses as it arrives (workers/pool/clause_split.py): text in,
clauses out, every character handed out once, in order, at its offset."""

from __future__ import annotations

import pytest

from workers.pool.clause_split import ClauseSplitter, speakable


def feed(pieces: list[str], *, end: bool = True) -> list[list[tuple[int, str]]]:
    """The clauses handed out after each piece (and at the end, everything)."""
    s = ClauseSplitter()
    out = []
    offset = 0
    for piece in pieces:
        s.add(piece, offset)
        offset += len(piece)
        out.append(s.take())
    if end:
        out.append(s.take(everything=True))
    return out


def joined(steps: list[list[tuple[int, str]]]) -> str:
    text = ""
    for clauses in steps:
        for offset, clause in clauses:
            assert offset == len(text), (offset, text)
            text += clause
    return text


def test_a_sentence_streamed_as_tokens_is_cut_where_its_marks_end() -> None:
    pieces = ["The", " night", " falls.", " Wolves", ",", " wake", " up", "!", " The", " village", " sleeps"]
    steps = feed(pieces)
    assert steps[2] == [(0, "The night falls.")]  # the mark ends what came: no wait for the space
    assert steps[3] == [] and steps[4] == [(16, " Wolves,")]
    assert steps[7] == [(24, " wake up!")]
    assert steps[-1] == [(33, " The village sleeps")]
    assert joined(steps) == "".join(pieces)


def test_decimals_times_and_abbreviations_go_on() -> None:
    steps = feed(["It is 3.", "5 degrees at 10:30 today", " and cold."])
    assert steps[0] == [] and steps[1] == []  # "3." may be a decimal: it waits for what follows
    assert steps[2] == [(0, "It is 3.5 degrees at 10:30 today and cold.")]


def test_chinese_marks_cut_at_once_without_spaces() -> None:
    steps = feed(["天黑请闭眼，", "狼人请睁眼。预言家", "请睁眼"])
    assert steps[0] == [(0, "天黑请闭眼，")]
    assert steps[1] == [(6, "狼人请睁眼。")]
    assert steps[-1] == [(12, "预言家请睁眼")]


def test_a_long_run_without_marks_is_cut_at_a_space_before_sixty_characters() -> None:
    words = " ".join(["word"] * 30)
    steps = feed([words], end=False)
    first = steps[0][0][1]
    assert len(first) <= 60 and first.endswith(" ") and first.count("word") == 12
    assert all(len(c) <= 60 for _o, c in steps[0])


def test_chinese_without_marks_is_cut_at_sixty() -> None:
    steps = feed(["狼" * 130], end=False)
    assert [len(c) for _o, c in steps[0]] == [60, 60]


def test_markup_is_never_cut_and_its_colon_is_no_mark() -> None:
    steps = feed(["Wait [pause:700] for it", " now."])
    assert steps[0] == []
    assert steps[1] == [(0, "Wait [pause:700] for it now.")]
    steps = feed(['Stop <break time="1.5s"/> here. Go'])
    assert steps[0] == [(0, 'Stop <break time="1.5s"/> here. ')]


def test_nothing_to_say_goes_with_the_next_clause() -> None:
    steps = feed(["Well", ", ", "...", " then."])
    assert steps[1] == [(0, "Well, ")]
    assert steps[2] == [] and steps[3] == [(6, "... then.")]
    assert not speakable(", ... [pause:200]") and speakable("a") and speakable("狼") and speakable("7")


@pytest.mark.parametrize("cut", range(1, 40))
def test_any_split_of_the_pieces_gives_the_same_text_once(cut: int) -> None:
    text = "The seer wakes, 3.5 times. 天黑了，请闭眼。 And [pause:300] then: silence!"
    steps = feed([text[:cut], text[cut:]])
    assert joined(steps) == text


def test_the_whole_words_so_far_can_be_taken_when_the_audio_runs_low() -> None:
    s = ClauseSplitter()
    s.add("while the seer turns in her be", 30)
    assert s.take() == []
    assert s.take_words() == (30, "while the seer turns in her ")  # "be" is still being written
    assert s.held == "be"
    s.add("d and dreams [pause:300] of", 58)
    assert s.take_words() == (58, "bed and dreams [pause:300] ")  # the pause whole, never cut
    assert s.take_words() is None  # "of": no whole word yet
    s2 = ClauseSplitter()
    s2.add(" , ", 0)
    assert s2.take_words() is None  # nothing to say
