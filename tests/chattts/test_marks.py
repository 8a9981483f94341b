"""ChatTTS word marks per text piece, through the real ChatTTS modules on the tiny checkpoint: a line
alone (``stream_timed``), a windowed batch (``stream_batch``) and continuous rows
(``stream_continuous``) each give every word of the request's text one mark, in order, offsets
into the text as given (before ChatTTS's normalizer), each piece's marks right after that piece's
last chunk and inside that piece's audio. Through the pool's wrapper (workers/engines/wrappers.py)
the offsets index the line as sent: markup and the lexicon's respellings mapped back.

The random model speaks no words: these tests check which words get marks and where in the audio
each piece's marks lie, never how well a mark fits a sound."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.chattts.conftest import make_engine, never, request
from voxroom.voices.text_split import split_text
from workers.engines.base import SynthesisRequest
from workers.engines.chattts import ChatTTSEngine
from workers.engines.lexicon import Lexicon
from workers.engines.marks import WordMark, split_words
from workers.engines.wrappers import RewritingEngine, wrap

pytestmark = pytest.mark.chattts

RATE = 24_000
PIECE_CHARS = 30
# Three pieces at 30 characters; ChatTTS's normalizer drops "3.5", "'" and "!" from the text it
# reads (it logs "found invalid characters"): the marks still name them as written.
TEXT = "Night falls on the village. Everyone, close your eyes; it is 3.5 o'clock now! 天黑请闭眼。"
SECOND = "Good morning, room two. The seer wakes up first."
# A voice switch cuts the pieces further (split_for_transition): four pieces instead of three.
SWITCH = request("Werewolves wake together and choose a victim quietly. The seer wakes alone.",
                 voice="c", previous="a")

Item = np.ndarray | list[WordMark]


@pytest.fixture(scope="module")
def windowed(tiny_dir: Path) -> Iterator[ChatTTSEngine]:
    e = make_engine(tiny_dir, max_piece_chars=PIECE_CHARS, word_marks=True)
    yield e
    e.close()


@pytest.fixture(scope="module")
def greedy_cont(tiny_dir: Path) -> Iterator[ChatTTSEngine]:
    """Argmax sampling, so a continuous row's audio (and marks) can be compared with its solo run."""
    e = make_engine(tiny_dir, max_piece_chars=PIECE_CHARS, word_marks=True, continuous=True,
                    temperature=0.0, fade_ms=0.0)
    yield e
    e.close()


def check_row(text: str, items: Iterable[Item], pieces: int) -> list[WordMark]:
    """One row's chunks and mark lists, in the order yielded: one list per piece (``pieces``), each
    after its piece's audio and inside it; together one mark per word of ``text``, in order, named
    by its place in ``text``; times monotone and inside the row's audio. Returns the marks."""
    marks: list[WordMark] = []
    heard = 0  # samples yielded so far
    piece_from = 0  # samples before the current piece (up to the previous mark list)
    lists = 0
    for item in items:
        if isinstance(item, list):
            lists += 1
            assert item, "an empty list of marks"
            for m in item:  # inside the audio of this piece, all of it already yielded
                assert piece_from * 1000 / RATE - 1e-6 <= m.start_ms <= m.end_ms <= heard * 1000 / RATE + 1e-6, m
            piece_from = heard
            marks += item
        else:
            assert item.dtype == np.float32 and item.ndim == 1
            heard += item.size
    assert lists == pieces
    assert [(m.text, m.offset, m.length) for m in marks] == [(w.text, w.offset, w.length) for w in split_words(text)]
    assert all(text[m.offset:m.offset + m.length] == m.text for m in marks)
    starts = [m.start_ms for m in marks]
    assert starts == sorted(starts) and starts[0] >= 0 and marks[-1].end_ms <= heard * 1000 / RATE + 1e-6
    return marks


def test_a_line_alone_gets_each_pieces_words_after_that_pieces_audio(windowed: ChatTTSEngine) -> None:
    items = list(windowed.stream_timed(request(TEXT), never()))
    check_row(TEXT, items, pieces=len(split_text(TEXT, PIECE_CHARS)))
    assert len(split_text(TEXT, PIECE_CHARS)) == 3
    # ``stream`` stays audio only.
    assert all(isinstance(c, np.ndarray) for c in windowed.stream(request(SECOND), never()))


def test_a_windowed_batch_of_three_gives_every_row_its_words(windowed: ChatTTSEngine) -> None:
    reqs = [request(TEXT, "a"), request(SECOND, "b"), SWITCH]
    rows: dict[int, list[Item]] = {0: [], 1: [], 2: []}
    for row, item in windowed.stream_batch(reqs, [never() for _ in reqs]):
        rows[row].append(item)
    for r, req in enumerate(reqs):
        check_row(req.text, rows[r], pieces=len(windowed.plan(req)[0]))
    assert len(windowed.plan(SWITCH)[0]) > len(split_text(SWITCH.text, PIECE_CHARS))  # the switch cut more


def test_without_word_marks_a_batch_yields_audio_only(windowed: ChatTTSEngine) -> None:
    windowed.word_marks = False
    try:
        items = [item for _, item in windowed.stream_batch([request(SECOND), request(TEXT)], [never(), never()])]
    finally:
        windowed.word_marks = True
    assert items and all(isinstance(i, np.ndarray) for i in items)


def run_continuous(engine: ChatTTSEngine, joins: dict[int, list[tuple[str, SynthesisRequest]]],
                   ) -> dict[Hashable, list[Item]]:
    """``joins[turn]`` rows admitted at that turn (a turn is one GPT step); each row's items, in
    order, until every row is reported done (once)."""
    got: dict[Hashable, list[Item]] = {}
    done: set[Hashable] = set()
    turn = 0

    def admit(timeout: float | None) -> list[tuple[Hashable, SynthesisRequest, threading.Event]] | None:
        nonlocal turn
        if not joins and done == set(got):
            return None
        if timeout is None and joins:
            turn = max(turn, min(joins))
        rows = joins.pop(turn, [])
        turn += 1
        for key, _ in rows:
            got[key] = []
        return [(key, req, never()) for key, req in rows]

    for key, item in engine.stream_continuous(admit):
        assert key not in done, f"{key} yielded after it was done"
        if item is None:
            done.add(key)
        else:
            got[key].append(item)
    return got


def test_continuous_rows_give_every_row_its_words_as_alone(greedy_cont: ChatTTSEngine) -> None:
    """Rows join at different steps; a multi-piece row moves piece to piece inside the batch. With
    argmax sampling each row's audio is its solo run's, and so are its marks."""
    reqs = {"text": request(TEXT, "a"), "second": request(SECOND, "b"), "switch": SWITCH}
    got = run_continuous(greedy_cont, {0: [("text", reqs["text"])], 7: [("second", reqs["second"])],
                                       20: [("switch", reqs["switch"])]})
    for key, req in reqs.items():
        marks = check_row(req.text, got[key], pieces=len(greedy_cont.plan(req)[0]))
        alone = [m for item in greedy_cont.stream_timed(req, never()) if isinstance(item, list) for m in item]
        assert [(m.offset, m.length) for m in marks] == [(m.offset, m.length) for m in alone]
        np.testing.assert_allclose([m.start_ms for m in marks], [m.start_ms for m in alone], atol=5.0)


def test_the_pools_wrapper_maps_marks_to_the_line_as_sent(windowed: ChatTTSEngine) -> None:
    """Pauses become a comma for ChatTTS and the lexicon respells words (one word into two, two
    into one); the marks name the words as written, offsets into the line with its markup."""
    engine = wrap(windowed, Lexicon.from_text("seer\tsee er\nthe village\tthevillage\n"))
    assert isinstance(engine, RewritingEngine)
    line = "Night falls on the village. [pause:500] The Seer wakes <break time=\"300ms\"/> and speaks. 天黑请闭眼。"
    spoken = line.replace("[pause:500]", " " * 11).replace('<break time="300ms"/>', " " * 21)
    want = [(w.text, w.offset, w.length) for w in split_words(spoken)]
    want[3:5] = [("the village", line.index("the village"), len("the village"))]  # one respelled word

    def words(items: Iterable[Item]) -> list[tuple[str, int, int]]:
        marks = [m for item in items if isinstance(item, list) for m in item]
        starts = [m.start_ms for m in marks]
        assert starts == sorted(starts)
        return [(m.text, m.offset, m.length) for m in marks]

    assert words(engine.stream_timed(SynthesisRequest(line, request("").voice), never())) == want
    rows: dict[int, list[Item]] = {0: [], 1: []}
    reqs = [SynthesisRequest(line, request("").voice), request(SECOND, "b")]
    for row, item in engine.stream_batch(reqs, [never(), never()]):
        rows[row].append(item)
    assert words(rows[0]) == want
    assert words(rows[1]) == [(w.text, w.offset, w.length) for w in split_words(SECOND)]
    # A line's own lexicon: "Seer" said as two words still gets one mark, named as written.
    own = SynthesisRequest("Wake up, Seer.", request("").voice, lexicon=(("Seer", "see er"),))
    assert words(engine.stream_timed(own, never())) == [("Wake", 0, 4), ("up", 5, 2), ("Seer", 9, 4)]


def test_one_row_at_a_time_the_narrator_wrapper_uses_the_pieces_marks(tiny_dir: Path) -> None:
    """``max_batch`` 1: the pool wraps ChatTTS in ``NarratorEngine``, which cuts the line at its
    pauses and takes each markup piece's marks from ChatTTS's ``stream_timed``."""
    from workers.engines.wrappers import NarratorEngine

    engine = wrap(make_engine(tiny_dir, max_batch=1, max_piece_chars=PIECE_CHARS), None)
    try:
        assert isinstance(engine, NarratorEngine)
        line = "Night falls on the village. [pause:300] Everyone, close your eyes."
        items = list(engine.stream_timed(SynthesisRequest(line, request("").voice), never()))
        marks = [m for item in items if isinstance(item, list) for m in item]
        spoken = line.replace("[pause:300]", " " * 11)
        want = [(w.text, w.offset, w.length) for w in split_words(spoken)]
        assert [(m.text, m.offset, m.length) for m in marks] == want
        heard_ms = sum(i.size for i in items if not isinstance(i, list)) * 1000 / RATE
        starts = [m.start_ms for m in marks]
        assert starts == sorted(starts) and marks[-1].end_ms <= heard_ms + 1e-6
    finally:
        engine.close()
