"""Engine wrappers that give every engine the narrator's text tools: pauses and the lexicon.

:class:`NarratorEngine` wraps an engine that streams one request at a time (Piper, espeak-ng, the
synthetic engine, ChatTTS with ``max_batch`` 1). A line with pauses (voxroom/voices/markup.py) is cut at
them; each text piece is synthesized by the inner engine, and the silence the engine pads each
piece with (Piper: ~30 ms before, 80-170 ms of decay after; espeak-ng: 7-50 ms) is trimmed at the
pause, so that the silence between the words is the pause asked for, then exact zeros of that
length go in. Trimming streams: audio is held back only while it is quiet, so the first piece
still starts playing before the whole piece is synthesized.

:class:`RewritingEngine` wraps a batch or continuous engine (ChatTTS on a GPU): pieces cannot be
synthesized one by one there without splitting a row, so pauses become the engine's own break
text (its ``pause_text(ms)`` when it has one: ChatTTS's break tokens are its business) or a
comma, never words. An engine that sets ``markup_native = True`` gets the markup as written and
renders it itself (``voxroom.voices.markup.parse``), the lexicon already applied to its words.

Both apply the lexicon (workers/engines/lexicon.py) to the words only, never to markup, with the
line's own entries (``SynthesisRequest.lexicon``) over it, and put what the audio depends on into
``model_version`` (the audio cache key): the markup renderer's version and the lexicon's hash
(a line's own entries are in that line's key instead). Every other attribute is the inner engine's.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from voxroom.errors import EngineError
from voxroom.voices import markup
from workers.engines.base import Admit, Engine, Pcm, RowItem, SynthesisRequest
from workers.engines.lexicon import Lexicon, for_line
from workers.engines.marks import Rewrite, WordMark, estimate_audio, map_back, split_words

MARKUP_VERSION: Final = "markup1"
"""Bump when the rendering of pauses changes: it is part of every wrapped engine's cache key."""
SILENCE_DBFS: Final = -45.0
"""Audio whose short-time RMS (:data:`WINDOW_MS`) is below this at a piece's edge is the engine's
padding or decay, not the word: what a listener hears as silence (quiet speech sits at -30 to
-15 dBFS). Set on Piper and espeak-ng: the silence measured between the words is then the pause
within 15 ms (tests/engines/test_markup.py)."""
WINDOW_MS: Final = 5.0


def _script(text: str) -> markup.Script:
    try:
        return markup.parse(text)
    except markup.MarkupError as exc:  # the gateway refuses these; an older one may not have
        raise EngineError(f"cannot speak the line: {exc}") from None


class _Wrapper:
    def __init__(self, inner: Engine, lexicon: Lexicon | None) -> None:
        self.inner = inner
        self.lexicon = lexicon
        self.name = inner.name

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes the wrapper lacks: the inner engine's options and flags
        # (``continuous``, ``threads``...) stay visible to the pool and to tests.
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def sample_rate(self) -> int:
        return self.inner.sample_rate

    @sample_rate.setter
    def sample_rate(self, value: int) -> None:
        self.inner.sample_rate = value

    @property
    def max_batch(self) -> int:
        return self.inner.max_batch

    @max_batch.setter
    def max_batch(self, value: int) -> None:
        self.inner.max_batch = value

    @property
    def model_version(self) -> str:
        parts = [str(getattr(self.inner, "model_version", "")), MARKUP_VERSION]
        if self.lexicon is not None and self.lexicon.version:
            parts.append(f"lexicon:{self.lexicon.version}")
        return "+".join(parts)

    def _respell(self, request: SynthesisRequest, words: str) -> tuple[str, list[Rewrite]]:
        """``words`` (a stretch without markup) with the deployment's lexicon and the line's own
        (``request.lexicon``, winning where both match) applied, and where each went. The line's
        entries are in its cache key (workers/pool/cache_race.py), so they stay out of ``model_version``."""
        base = self.lexicon if self.lexicon is not None else _NO_LEXICON
        return base.apply_spans(words, self.name, override=for_line(request.lexicon))

    def load(self, device: str) -> None:
        self.inner.load(device)

    def close(self) -> None:
        self.inner.close()


class NarratorEngine(_Wrapper):
    """Pauses as exact silence and the lexicon, around an engine that streams one request at a time."""

    def __init__(self, inner: Engine, *, lexicon: Lexicon | None = None,
                 silence_dbfs: float = SILENCE_DBFS) -> None:
        super().__init__(inner, lexicon)
        self.silence_power = 10 ** (silence_dbfs / 10)

    def _loud(self, chunk: Pcm) -> npt.NDArray[np.intp]:
        """Indices of ``chunk`` whose centred short-time power is above the silence threshold."""
        width = max(1, int(self.sample_rate * WINDOW_MS / 1000))
        power = np.concatenate([[0.0], np.cumsum(chunk.astype(np.float64) ** 2)])
        lo = np.clip(np.arange(chunk.size) - width // 2, 0, chunk.size)
        hi = np.clip(lo + width, 0, chunk.size)
        mean = (power[hi] - power[lo]) / np.maximum(hi - lo, 1)
        return np.flatnonzero(mean > self.silence_power)

    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm]:
        """The inner engine's audio, piece by piece, with exact pauses between. Raises
        :class:`EngineError` for markup that is not understood (on the first ``next()``)."""
        pieces = _script(request.text).pieces
        last = len(pieces) - 1
        spoken = sum(1 for piece in pieces if not isinstance(piece, markup.Pause))
        spoke = 0
        for i, piece in enumerate(pieces):
            if cancel.is_set():
                return
            if isinstance(piece, markup.Pause):
                yield np.zeros(round(piece.ms * self.sample_rate / 1000), dtype=np.float32)
                continue
            text = self._respell(request, piece)[0]
            yield from self._trimmed(_part(request, text, spoke, spoken), cancel, head=i > 0, tail=i < last)
            spoke += 1

    def stream_timed(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm | list[WordMark]]:
        """:meth:`stream`'s audio with word marks (:class:`workers.engines.base.TimedEngine`).
        Offsets index ``request.text`` as given, markup included (the room's ``start.text``):
        a word's offset is where it is written in the line; markup never makes a mark. Words the
        lexicon respelled are named as written. Times count from the line's first sample, across
        the trimmed pieces and the pauses. An inner engine without word timings gets
        :func:`workers.engines.marks.estimate_audio` per piece, given after the piece's audio."""
        pieces = _script(request.text).pieces
        places = _piece_offsets(request.text, pieces)
        last = len(pieces) - 1
        spoken = sum(1 for piece in pieces if not isinstance(piece, markup.Pause))
        spoke = 0
        at = 0  # samples of the line given out so far
        timed = callable(getattr(self.inner, "stream_timed", None))
        for i, piece in enumerate(pieces):
            if cancel.is_set():
                return
            if isinstance(piece, markup.Pause):
                silence = np.zeros(round(piece.ms * self.sample_rate / 1000), dtype=np.float32)
                at += silence.size
                yield silence
                continue
            text, rewrites = self._respell(request, piece)
            places_ms = at * 1000 / self.sample_rate
            marks = _PieceMarks(piece, rewrites, chars=places[i], ms=places_ms, tail=i < last)
            audio: list[Pcm] = []
            for item in self._trim(_part(request, text, spoke, spoken), cancel, head=i > 0, tail=i < last,
                                   timed=True):
                if isinstance(item, list):
                    yield from marks.add(item)
                else:
                    at += item.size
                    if not timed:
                        audio.append(item)
                    yield from marks.audio(item)
            yield from marks.finish(at * 1000 / self.sample_rate)
            if audio and not cancel.is_set():
                guessed = estimate_audio(piece, np.concatenate(audio), self.sample_rate, places_ms)
                if guessed:
                    yield [m.shifted(chars=places[i]) for m in guessed]
            spoke += 1

    def _trimmed(self, request: SynthesisRequest, cancel: threading.Event, *, head: bool,
                 tail: bool) -> Iterator[Pcm]:
        """The inner stream without its quiet lead-in (``head``) and quiet tail (``tail``)."""
        for item in self._trim(request, cancel, head=head, tail=tail, timed=False):
            if not isinstance(item, list):
                yield item

    def _trim(self, request: SynthesisRequest, cancel: threading.Event, *, head: bool, tail: bool,
              timed: bool) -> Iterator[Pcm | list[WordMark]]:
        """:meth:`_trimmed`, with the inner engine's word marks (``timed``) moved back by the
        trimmed lead-in; marks that came before the first sound wait for it."""
        started = not head
        cut = 0  # samples of lead-in dropped
        early: list[WordMark] = []
        held: list[Pcm] = []  # quiet audio at the end of what came so far: the tail, if nothing follows
        stream_timed = getattr(self.inner, "stream_timed", None) if timed else None
        chunks: Iterator[Pcm | list[WordMark]] = (stream_timed(request, cancel) if callable(stream_timed)
                                                   else self.inner.stream(request, cancel))
        try:
            for chunk in chunks:
                if isinstance(chunk, list):
                    if started:
                        yield _earlier(chunk, cut * 1000 / self.sample_rate)
                    else:
                        early.extend(chunk)
                    continue
                if started and not tail:
                    yield chunk
                    continue
                loud = self._loud(chunk)
                if not started:
                    if loud.size == 0:
                        cut += chunk.size
                        continue
                    cut += int(loud[0])
                    chunk, loud, started = chunk[loud[0]:], loud - loud[0], True
                    if early:
                        yield _earlier(early, cut * 1000 / self.sample_rate)
                if not tail:
                    yield chunk
                elif loud.size == 0:
                    held.append(chunk)
                else:
                    end = int(loud[-1]) + 1
                    yield np.concatenate([*held, chunk[:end]]) if held else chunk[:end]
                    held = [chunk[end:]] if end < chunk.size else []
        finally:
            # Now, not when collected: espeak-ng's stream releases a process-wide lock on close.
            close = getattr(chunks, "close", None)
            if callable(close):
                close()


def _earlier(marks: list[WordMark], ms: float) -> list[WordMark]:
    return [dataclasses.replace(m, start_ms=max(0.0, m.start_ms - ms), end_ms=max(0.0, m.end_ms - ms)) for m in marks]


def _piece_offsets(text: str, pieces: Sequence[markup.Piece]) -> list[int]:
    """Where each text piece of ``markup.parse(text)`` is written in ``text`` (0 for a pause):
    the pieces are the stretches between pause tokens, stripped, the empty ones left out."""
    starts: list[int] = []
    last = 0
    # The parser's own token pattern and reader, so that both cut the line at the same places.
    ends = [found for found in markup._CANDIDATE.finditer(text) if markup._pause(found.group()) is not None]
    for end in [*(found.start() for found in ends), len(text)]:
        stretch = text[last:end]
        if stretch.strip():
            starts.append(last + len(stretch) - len(stretch.lstrip()))
        last = next((found.end() for found in ends if found.start() == end), end)
    places = iter(starts)
    return [0 if isinstance(piece, markup.Pause) else next(places, 0) for piece in pieces]


class _PieceMarks:
    """One piece's marks, mapped to the line: offsets past the piece's place, respelled words
    back to the words as written, times past the piece's start.

    Two kinds of mark wait, and the audio that comes meanwhile waits with them (each mark still
    goes out before the audio it starts in): a respelled word's, until the respelling is heard
    in full; and, before a pause (``tail``), the piece's last word's, until the piece ends, so
    that it ends where the trimmed audio ends rather than in the engine's trailing silence."""

    def __init__(self, written: str, rewrites: Sequence[Rewrite], *, chars: int, ms: float, tail: bool) -> None:
        self.written = written
        self.rewrites = rewrites
        self.chars = chars
        self.ms = ms
        words = split_words(written)
        self._last = chars + words[-1].offset if tail and words else None
        self._pending: list[WordMark] = []  # as the inner engine gave them
        self._held: list[WordMark] = []  # mapped
        self._audio: list[Pcm] = []

    def _inside(self, mark: WordMark) -> bool:
        return any(r.new_offset <= mark.offset < r.new_offset + r.new_length for r in self.rewrites)

    def _mapped(self, marks: list[WordMark]) -> list[WordMark]:
        return [m.shifted(self.ms, self.chars) for m in map_back(marks, self.written, self.rewrites)]

    def add(self, marks: list[WordMark]) -> Iterator[Pcm | list[WordMark]]:
        self._pending.extend(marks)
        keep = len(self._pending)
        while keep and self._inside(self._pending[keep - 1]):
            keep -= 1  # a respelling is closed by a mark after it, or by the piece's end
        ready = self._mapped(self._pending[:keep])
        self._pending = self._pending[keep:]
        if ready and ready[-1].offset == self._last:
            self._held.append(ready.pop())
        if ready:
            yield ready
        yield from self._release()

    def audio(self, chunk: Pcm) -> Iterator[Pcm]:
        if self._pending or self._held:
            self._audio.append(chunk)
        else:
            yield chunk

    def _release(self) -> Iterator[Pcm]:
        if not (self._pending or self._held):
            yield from self._audio
            self._audio = []

    def finish(self, end_ms: float) -> Iterator[Pcm | list[WordMark]]:
        """The rest, every word ending by ``end_ms`` (the piece's end in the line)."""
        rest = [*self._held, *self._mapped(self._pending)]
        self._held, self._pending = [], []
        if rest:
            yield [dataclasses.replace(m, end_ms=max(m.start_ms, min(m.end_ms, end_ms))) for m in rest]
        yield from self._release()


def _part(request: SynthesisRequest, text: str, index: int, count: int) -> SynthesisRequest:
    """Spoken piece ``index`` of ``count`` of ``request``: a voice switch in progress
    (``switch_range``) is shared out between the pieces in order, so the line as a whole still
    moves over its part of the switch and its last piece ends where the line ends."""
    start, end = request.switch_range
    step = (end - start) / max(1, count)
    stop = end if index + 1 >= count else start + step * (index + 1)
    # ``lexicon`` emptied: ``text`` is already respelled.
    return dataclasses.replace(request, text=text, switch_range=(start + step * index, stop), lexicon=())


@dataclasses.dataclass(frozen=True, slots=True)
class _LineMap:
    """Where the text given to a batch engine came from in the line as sent: the lexicon's
    respellings and the stretches between spoken pieces (pauses and their break text, the joins)
    as ``Rewrite`` spans in text order, and which spans of the engine's text are no word of the
    line (``gaps``: a break text's words, markup kept for a native engine)."""

    original: str
    text: str
    rewrites: tuple[Rewrite, ...]
    gaps: tuple[tuple[int, int], ...]

    def marks(self, marks: list[WordMark]) -> list[WordMark]:
        """Marks over :attr:`text` as marks over :attr:`original` (``marks.map_back``): offsets
        where the words are written in the line, markup included; respelled words named as
        written; marks of words the line does not have dropped. A respelling the engine times
        in two calls (cut between two of its text pieces) gets a mark from each."""
        kept = [m for m in marks if not any(a <= m.offset < b for a, b in self.gaps)]
        return map_back(kept, self.original, self.rewrites) if kept else []


class RewritingEngine(_Wrapper):
    """The lexicon, and pauses as the engine's own break text, around a batch or continuous engine.

    Word marks: an inner engine with a ``word_marks`` switch (ChatTTS) has it turned on, and the
    marks it yields in :meth:`stream_batch`, :meth:`stream_continuous` and :meth:`stream_timed`
    are mapped back to the line as sent (``request.text``, markup included), as
    :class:`NarratorEngine` maps its pieces' marks."""

    def __init__(self, inner: Engine, lexicon: Lexicon | None) -> None:
        super().__init__(inner, lexicon)
        if hasattr(inner, "word_marks"):
            # Only this wrapper knows how to map the engine's marks to the line: an engine used
            # bare keeps yielding audio only.
            inner.word_marks = True

    def _line(self, request: SynthesisRequest) -> _LineMap:
        text = request.text
        script = _script(text)
        if getattr(self.inner, "markup_native", False):
            return self._native(request)
        pause_text = getattr(self.inner, "pause_text", None)
        out: list[str] = []
        rewrites: list[Rewrite] = []
        gaps: list[tuple[int, int]] = []
        size = 0  # len(" ".join(out))
        written_end = new_end = 0  # where the last spoken piece ends, in the line and in ``out``

        def add(part: str) -> int:
            nonlocal size
            at = size + (1 if out else 0)
            out.append(part)
            size = at + len(part)
            return at

        for piece, place in zip(script.pieces, _piece_offsets(text, script.pieces), strict=True):
            if isinstance(piece, markup.Pause):
                if callable(pause_text):
                    add(str(pause_text(piece.ms)))
                elif out and out[-1][-1:] not in ".,;:!?。，；：！？":
                    add(",")
                continue
            respelled, spans = self._respell(request, piece)
            at = add(respelled)
            if (place, at) != (written_end, new_end):
                # Between two spoken pieces: pause markup in the line, break text or a comma here.
                rewrites.append(Rewrite(written_end, place - written_end, new_end, at - new_end))
                if at > new_end:
                    gaps.append((new_end, at))
            rewrites += [Rewrite(place + r.offset, r.length, at + r.new_offset, r.new_length) for r in spans]
            written_end, new_end = place + len(piece), at + len(respelled)
        return _LineMap(text, " ".join(out), tuple(rewrites), tuple(gaps))

    def _native(self, request: SynthesisRequest) -> _LineMap:
        """An engine that renders the markup itself: its words respelled, the markup as written
        (as ``markup.map_words``), the pause tokens no words of the line."""
        text = request.text
        out: list[str] = []
        rewrites: list[Rewrite] = []
        gaps: list[tuple[int, int]] = []
        size = last = 0

        def stretch(end: int) -> None:
            nonlocal size
            respelled, spans = self._respell(request, text[last:end])
            rewrites.extend(Rewrite(last + r.offset, r.length, size + r.new_offset, r.new_length) for r in spans)
            out.append(respelled)
            size += len(respelled)

        for found in markup._CANDIDATE.finditer(text):
            if markup._pause(found.group()) is None:
                continue
            stretch(found.start())
            gaps.append((size, size + len(found.group())))
            out.append(found.group())
            size += len(found.group())
            last = found.end()
        stretch(len(text))
        return _LineMap(text, "".join(out), tuple(rewrites), tuple(gaps))

    def _text(self, request: SynthesisRequest) -> str:
        return self._line(request).text

    def _request(self, request: SynthesisRequest) -> SynthesisRequest:
        return dataclasses.replace(request, text=self._text(request), lexicon=())

    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm]:
        return self.inner.stream(self._request(request), cancel)

    def stream_timed(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm | list[WordMark]]:
        """The inner engine's ``stream_timed`` (:class:`workers.engines.base.TimedEngine`), its
        marks mapped to the line as sent; only audio from an inner engine without one."""
        line = self._line(request)
        inner = dataclasses.replace(request, text=line.text, lexicon=())
        timed = getattr(self.inner, "stream_timed", None)
        if not callable(timed):
            yield from self.inner.stream(inner, cancel)
            return
        for item in timed(inner, cancel):
            if isinstance(item, list):
                if marks := line.marks(item):
                    yield marks
            else:
                yield item

    def stream_batch(self, requests: Sequence[SynthesisRequest],
                     cancel: Sequence[threading.Event]) -> Iterator[tuple[int, RowItem]]:
        lines = [self._line(r) for r in requests]
        batch = getattr(self.inner, "stream_batch")  # noqa: B009 - only batch engines get here
        rows: Iterator[tuple[int, RowItem]] = batch(
            [dataclasses.replace(r, text=line.text, lexicon=()) for r, line in zip(requests, lines, strict=True)],
            cancel)
        for row, item in rows:
            if isinstance(item, list):
                if marks := lines[row].marks(item):
                    yield row, marks
            else:
                yield row, item

    def stream_continuous(self, admit: Admit) -> Iterator[tuple[Hashable, RowItem | None]]:
        lines: dict[Hashable, _LineMap] = {}

        def rewritten(timeout: float | None) -> list[tuple[Hashable, SynthesisRequest, threading.Event]] | None:
            rows = admit(timeout)
            if rows is None:
                return None
            out: list[tuple[Hashable, SynthesisRequest, threading.Event]] = []
            for key, req, ev in rows:
                line = self._line(req)
                lines[key] = line
                out.append((key, dataclasses.replace(req, text=line.text, lexicon=()), ev))
            return out

        continuous = getattr(self.inner, "stream_continuous")  # noqa: B009
        events: Iterator[tuple[Hashable, RowItem | None]] = continuous(rewritten)
        for key, item in events:
            if item is None:
                lines.pop(key, None)
                yield key, None
            elif isinstance(item, list):
                line = lines.get(key)
                if line is not None and (marks := line.marks(item)):
                    yield key, marks
            else:
                yield key, item


_NO_LEXICON: Final = Lexicon(())
"""What a deployment without ``VOXROOM_LEXICON`` applies: nothing but a line's own entries."""


def wrap(engine: Engine, lexicon: Lexicon | None = None) -> NarratorEngine | RewritingEngine:
    """The wrapper that fits ``engine``: :class:`NarratorEngine` for one-at-a-time engines,
    :class:`RewritingEngine` for batch and continuous ones."""
    batching = engine.max_batch > 1 and callable(getattr(engine, "stream_batch", None))
    if batching or getattr(engine, "markup_native", False):
        return RewritingEngine(engine, lexicon)
    return NarratorEngine(engine, lexicon=lexicon)
