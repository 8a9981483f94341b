"""The batch engines' wrapper (``markup.RewritingEngine``) maps its inner engine's word marks back
to the line as sent: through the pauses it turns into break text or a comma, the markup a native
engine keeps, and the lexicon's respellings (the deployment's and the line's own), in
``stream_batch``, ``stream_continuous`` and ``stream_timed`` alike. The inner engine here marks
every word of the text it is given, in order (what ChatTTS's pieces give, without the model)."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator, Sequence
from typing import Any

import numpy as np
import pytest

from voxroom.voices.catalog import Voice
from workers.engines.base import Admit, RowItem, SynthesisRequest
from workers.engines.lexicon import Lexicon
from workers.engines.marks import WordMark, split_words
from workers.engines.wrappers import RewritingEngine, wrap

VOICE = Voice(id="v", engine="echo", language="eng")
LEXICON = Lexicon.from_text("seer\tsee er\nthe village\tthevillage\n")
LINE = "Night falls on the village. [pause:500] The Seer wakes <break time=\"300ms\"/> and speaks. 天黑请闭眼。"


class WordEcho:
    """A batch and continuous engine that marks each word of its text (10 ms a word), after a
    chunk of silence, when ``word_marks`` is on; records the texts it was given."""

    name = "echo"
    sample_rate = 1000
    max_batch = 4
    continuous = False

    def __init__(self, **attrs: Any) -> None:
        self.word_marks = False
        self.texts: list[str] = []
        for key, value in attrs.items():
            setattr(self, key, value)

    def load(self, device: str) -> None:
        pass

    def close(self) -> None:
        pass

    def _items(self, text: str) -> Iterator[RowItem]:
        self.texts.append(text)
        words = split_words(text)
        yield np.zeros(10 * len(words), dtype=np.float32)
        if self.word_marks:
            yield [WordMark(w.text, w.offset, w.length, 10.0 * i, 10.0 * i + 5) for i, w in enumerate(words)]

    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Any]:
        for item in self._items(request.text):
            if not isinstance(item, list):
                yield item

    def stream_timed(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[RowItem]:
        words_on, self.word_marks = self.word_marks, True
        try:
            yield from self._items(request.text)
        finally:
            self.word_marks = words_on

    def stream_batch(self, requests: Sequence[SynthesisRequest],
                     cancel: Sequence[threading.Event]) -> Iterator[tuple[int, RowItem]]:
        for row, request in enumerate(requests):
            for item in self._items(request.text):
                yield row, item

    def stream_continuous(self, admit: Admit) -> Iterator[tuple[Hashable, RowItem | None]]:
        while (rows := admit(0)) is not None:
            for key, request, _ in rows:
                for item in self._items(request.text):
                    yield key, item
                yield key, None


def written(line: str) -> list[tuple[str, int, int]]:
    """The line's words as a listener reads them: markup blanked, ``the village`` one mark (its
    respelling is one word), ``Seer`` one (its respelling is two)."""
    blank = line.replace("[pause:500]", " " * 11).replace('<break time="300ms"/>', " " * 21)
    words = [(w.text, w.offset, w.length) for w in split_words(blank)]
    at = line.find("the village")
    if at >= 0:
        words = [w for w in words if not at <= w[1] < at + 11]
        words.append(("the village", at, 11))
    return sorted(words, key=lambda w: w[1])


def names(marks: Sequence[WordMark]) -> list[tuple[str, int, int]]:
    return [(m.text, m.offset, m.length) for m in marks]


@pytest.mark.parametrize("inner", [WordEcho(), WordEcho(pause_text=lambda ms: "[uv_break]"),
                                   WordEcho(markup_native=True)], ids=["comma", "break-text", "native"])
def test_marks_name_the_words_of_the_line_as_sent(inner: WordEcho) -> None:
    engine = wrap(inner, LEXICON)
    assert isinstance(engine, RewritingEngine) and inner.word_marks, "the wrapper turns the marks on"
    want = written(LINE)
    second = SynthesisRequest("Wake up, Seer.", VOICE, lexicon=(("Seer", "sea ear"),))
    rows: dict[int, list[WordMark]] = {0: [], 1: []}
    for row, item in engine.stream_batch([SynthesisRequest(LINE, VOICE), second], [threading.Event()] * 2):
        if isinstance(item, list):
            rows[row] += item
    assert names(rows[0]) == want
    assert names(rows[1]) == [("Wake", 0, 4), ("up", 5, 2), ("Seer", 9, 4)]
    assert "see er" in inner.texts[0] and "sea ear" in inner.texts[1]  # the engine spoke the respellings
    # The same through stream_timed (a line alone) and continuous rows.
    timed = [m for item in engine.stream_timed(SynthesisRequest(LINE, VOICE), threading.Event())
             if isinstance(item, list) for m in item]
    assert names(timed) == want
    pending: list[list[tuple[Hashable, SynthesisRequest, threading.Event]] | None] = [
        [("a", SynthesisRequest(LINE, VOICE), threading.Event()), ("b", second, threading.Event())], None]
    got: dict[Hashable, list[WordMark]] = {"a": [], "b": []}
    ended = []
    for key, event in engine.stream_continuous(lambda timeout: pending.pop(0)):
        if event is None:
            ended.append(key)
        elif isinstance(event, list):
            got[key] += event
    assert ended == ["a", "b"] and names(got["a"]) == want and names(got["b"]) == names(rows[1])
    # A respelling said as two words is one mark from the first's start to the last's end.
    seer = next(m for m in timed if m.text == "Seer")
    assert seer.end_ms - seer.start_ms > 10


def test_an_engine_used_bare_yields_audio_only() -> None:
    inner = WordEcho()
    items = [item for _, item in inner.stream_batch([SynthesisRequest("Hello there.", VOICE)], [threading.Event()])]
    assert items and not any(isinstance(i, list) for i in items)
