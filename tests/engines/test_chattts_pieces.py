"""ChatTTS's word marks come per text piece (workers/engines/chattts/timing.py): the pieces
``split_text`` and ``split_for_transition`` cut must keep the text's words, in order, and
``PieceTimer`` must give each word of the text one mark, named by its place in the text, whatever
the cuts do to spaces and closing quotes. Pure: no torch, the audio is the synthetic engine's."""

from __future__ import annotations

import numpy as np
import pytest

from voxroom.voices.text_split import split_for_transition, split_text
from workers.engines.chattts.timing import PieceTimer
from workers.engines.marks import WordMark, split_words
from workers.engines.synthetic import SyntheticEngine

TEXTS = [
    "Night falls on the village.  Everyone, close your eyes. 天黑请闭眼。狼人请睁眼。",
    '"Run!" she said. "Now." Then, quietly: it is 3.5 o\'clock, and the well-known seer wakes.',
    "天黑请闭眼，" * 30 + "预言家请睁眼。",  # a long run without spaces: hard cuts between characters
    "Supercalifragilistic" * 8 + " is a word that no piece can hold whole.",  # a hard cut inside a word
    "Abcdefghijklmnopqrstuvwxyz go now. Then more words follow here.",  # cut twice at 12 characters
    "Yes. No. Maybe.\n\nA new paragraph (with brackets) and 'quotes' — and a dash.",
    "Hello，world：mixed ASCII and full-width punctuation！OK？",
]


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("max_chars", [12, 30, 120])
def test_pieces_keep_the_texts_words_in_order(text: str, max_chars: int) -> None:
    pieces = split_text(text, max_chars)
    for cut in (pieces, split_for_transition(pieces, 6)):
        joined = [w.text for piece in cut for w in split_words(piece)]
        whole = [w.text for w in split_words(text)]
        # A hard cut inside a word makes two pieces' words of one: joined back, the same letters.
        assert "".join(joined) == "".join(whole)
        if all(len(w) <= max_chars for w in whole):
            assert joined == whole


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("max_chars", [12, 30, 120])
def test_piece_timer_gives_every_word_of_the_text_once_within_its_piece(text: str, max_chars: int) -> None:
    engine = SyntheticEngine()
    rate = engine.sample_rate
    pieces = split_for_transition(split_text(text, max_chars), 4)
    timer = PieceTimer(text, rate)
    marks: list[WordMark] = []
    heard = 0
    for piece in pieces:
        audio = engine._audio(piece)
        got = timer.piece(piece, audio)
        # Each word is timed in the piece it is written in (a word cut in two: where it starts).
        assert all(any(m.text.startswith(w.text) for w in split_words(piece)) for m in got), (piece, got)
        assert all(heard * 1000 / rate <= m.start_ms <= m.end_ms <= (heard + audio.size) * 1000 / rate + 1e-6
                   for m in got), "a piece's marks lie in that piece's audio"
        heard += audio.size
        marks += got
    assert [(m.text, m.offset, m.length) for m in marks] == [(w.text, w.offset, w.length) for w in split_words(text)]
    starts = [m.start_ms for m in marks]
    assert starts == sorted(starts)


def test_a_piece_without_words_moves_the_time_on() -> None:
    timer = PieceTimer("... Go.", 1000)
    assert timer.piece("...", np.full(500, 0.5, dtype=np.float32)) == []
    (go,) = timer.piece("Go.", SyntheticEngine(sample_rate=1000)._audio("Go."))
    assert (go.text, go.offset) == ("Go", 4) and go.start_ms >= 500
