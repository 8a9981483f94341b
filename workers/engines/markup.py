"""Engine wrappers that give every engine the narrator's text tools: pauses and the lexicon.

:class:`NarratorEngine` wraps an engine that streams one request at a time (Piper, espeak-ng, the
synthetic engine, ChatTTS with ``max_batch`` 1). A line with pauses (voxroom/markup.py) is cut at
them; each text piece is synthesized by the inner engine, and the silence the engine pads each
piece with (Piper: ~30 ms before, 80-170 ms of decay after; espeak-ng: 7-50 ms) is trimmed at the
pause, so that the silence between the words is the pause asked for, then exact zeros of that
length go in. Trimming streams: audio is held back only while it is quiet, so the first piece
still starts playing before the whole piece is synthesized.

:class:`RewritingEngine` wraps a batch or continuous engine (ChatTTS on a GPU): pieces cannot be
synthesized one by one there without splitting a row, so pauses become the engine's own break
text (its ``pause_text(ms)`` when it has one: ChatTTS's break tokens are its business) or a
comma, never words. An engine that sets ``markup_native = True`` gets the markup as written and
renders it itself (``voxroom.markup.parse``), the lexicon already applied to its words.

Both apply the lexicon (workers/engines/lexicon.py) to the words only, never to markup, and put
what the audio depends on into ``model_version`` (the audio cache key): the markup renderer's
version and the lexicon's hash. Every other attribute is the inner engine's.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Hashable, Iterator, Sequence
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from voxroom import markup
from voxroom.errors import EngineError
from workers.engines.base import Admit, Engine, Pcm, SynthesisRequest
from workers.engines.lexicon import Lexicon

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


def _with_lexicon(lexicon: Lexicon | None, engine: str, text: str) -> str:
    return lexicon.apply(text, engine) if lexicon is not None else text


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
        spoke = 0
        for i, piece in enumerate(pieces):
            if cancel.is_set():
                return
            if isinstance(piece, markup.Pause):
                yield np.zeros(round(piece.ms * self.sample_rate / 1000), dtype=np.float32)
                continue
            text = _with_lexicon(self.lexicon, self.name, piece)
            # A voice switch (``previous_voice``) happens once, at the line's first words.
            previous = request.previous_voice if spoke == 0 else request.voice
            spoke += 1
            yield from self._trimmed(dataclasses.replace(request, text=text, previous_voice=previous), cancel,
                                     head=i > 0, tail=i < last)

    def _trimmed(self, request: SynthesisRequest, cancel: threading.Event, *, head: bool,
                 tail: bool) -> Iterator[Pcm]:
        """The inner stream without its quiet lead-in (``head``) and quiet tail (``tail``)."""
        started = not head
        held: list[Pcm] = []  # quiet audio at the end of what came so far: the tail, if nothing follows
        chunks = self.inner.stream(request, cancel)
        try:
            for chunk in chunks:
                if started and not tail:
                    yield chunk
                    continue
                loud = self._loud(chunk)
                if not started:
                    if loud.size == 0:
                        continue
                    chunk, loud, started = chunk[loud[0]:], loud - loud[0], True
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


class RewritingEngine(_Wrapper):
    """The lexicon, and pauses as the engine's own break text, around a batch or continuous engine."""

    def _text(self, text: str) -> str:
        script = _script(text)
        native = bool(getattr(self.inner, "markup_native", False))
        if native:
            # Words get the lexicon; the markup stays as written for the engine to render.
            return markup.map_words(text, lambda words: _with_lexicon(self.lexicon, self.name, words))
        pause_text = getattr(self.inner, "pause_text", None)
        out: list[str] = []
        for piece in script.pieces:
            if isinstance(piece, markup.Pause):
                if callable(pause_text):
                    out.append(str(pause_text(piece.ms)))
                elif out and out[-1][-1:] not in ".,;:!?。，；：！？":
                    out.append(",")
                continue
            out.append(_with_lexicon(self.lexicon, self.name, piece))
        return " ".join(out)

    def _request(self, request: SynthesisRequest) -> SynthesisRequest:
        return dataclasses.replace(request, text=self._text(request.text))

    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm]:
        return self.inner.stream(self._request(request), cancel)

    def stream_batch(self, requests: Sequence[SynthesisRequest],
                     cancel: Sequence[threading.Event]) -> Iterator[tuple[int, Pcm]]:
        batch = getattr(self.inner, "stream_batch")  # noqa: B009 - only batch engines get here
        rows: Iterator[tuple[int, Pcm]] = batch([self._request(r) for r in requests], cancel)
        return rows

    def stream_continuous(self, admit: Admit) -> Iterator[tuple[Hashable, Pcm | None]]:
        def rewritten(timeout: float | None) -> list[tuple[Hashable, SynthesisRequest, threading.Event]] | None:
            rows = admit(timeout)
            return None if rows is None else [(key, self._request(req), ev) for key, req, ev in rows]

        continuous = getattr(self.inner, "stream_continuous")  # noqa: B009
        out: Iterator[tuple[Hashable, Pcm | None]] = continuous(rewritten)
        return out


def wrap(engine: Engine, lexicon: Lexicon | None = None) -> NarratorEngine | RewritingEngine:
    """The wrapper that fits ``engine``: :class:`NarratorEngine` for one-at-a-time engines,
    :class:`RewritingEngine` for batch and continuous ones."""
    batching = engine.max_batch > 1 and callable(getattr(engine, "stream_batch", None))
    if batching or getattr(engine, "markup_native", False):
        return RewritingEngine(engine, lexicon)
    return NarratorEngine(engine, lexicon=lexicon)
