"""The engine interface: text and a voice in, PCM chunks out, as early as the engine allows.

Engines are blocking and single-threaded by contract: the pool calls every method of one engine
instance from that instance's own thread (its *context*), never from the event loop. An engine
never sees Redis, asyncio or the wire protocol.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from voxroom.voices.catalog import Voice
from workers.engines.marks import WordMark

Pcm = npt.NDArray[np.float32]
"""Mono float32 samples in [-1, 1] at the engine's :attr:`Engine.sample_rate`."""


@dataclass(frozen=True, slots=True)
class SynthesisRequest:
    text: str
    voice: Voice
    request_id: str = ""
    previous_voice: Voice | None = None
    """The voice a switch in progress moves from, for engines that interpolate on a switch
    (``None``, or ``voice`` itself: no switch)."""
    switch_range: tuple[float, float] = (0.0, 1.0)
    """The part of the ``previous_voice`` -> ``voice`` path this utterance covers (0: the old voice,
    1: the new one). A switch spread over L lines gives line k ``(k/L, (k+1)/L)``; the default is a
    whole switch within this one utterance. Meaningless without ``previous_voice``."""
    lexicon: tuple[tuple[str, str], ...] = ()
    """The line's own ``(word, respelling)`` entries (``say``'s ``lexicon``), sorted by word: the
    engine wrapper (workers/engines/wrappers.py) applies them over the deployment's lexicon and
    hands the inner engine the respelled text with this emptied. A tuple, so a request stays
    hashable."""


@runtime_checkable
class Engine(Protocol):
    name: str
    sample_rate: int
    max_batch: int
    """Largest batch :meth:`stream_batch` accepts; 1 for engines that do not batch."""

    def load(self, device: str) -> None:
        """Load weights onto ``device`` (``cpu``, ``cuda:0``...). Raises ``EngineError``."""
        ...

    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm]:
        """Yield the utterance's audio in chunks. Stop early (without error) once ``cancel`` is set."""
        ...

    def close(self) -> None:
        ...


RowItem = Pcm | list[WordMark]
"""What a batch or continuous engine yields for a row: a chunk of its audio, or word marks
(workers/engines/marks.py) whose times count from the row's first sample and whose offsets index
its ``request.text``. Marks may come before or after the audio they fall in: an engine gives them
as soon as it knows them (ChatTTS: right after each text piece's last chunk). The worker hands
lists to the row's marks (``workers/pool/row_audio.py`` ``Row.mark``), the rest to its audio."""


@runtime_checkable
class BatchEngine(Engine, Protocol):
    def stream_batch(self, requests: Sequence[SynthesisRequest],
                     cancel: Sequence[threading.Event]) -> Iterator[tuple[int, RowItem]]:
        """Synthesize several requests at once; yield ``(row, chunk)`` as each row's audio is ready,
        and ``(row, marks)`` (a ``list[WordMark]``, :data:`RowItem`) where the engine times words.
        A row whose ``cancel`` is set stops without stopping the others."""
        ...


Admit = Callable[[float | None], list[tuple[Hashable, SynthesisRequest, threading.Event]] | None]
"""What a continuous engine calls between steps: the new ``(key, request, cancel)`` rows, waiting
up to the given seconds (``None``: until one comes) when there are none yet. An empty list after
the wait: nothing came. ``None``: stop (the context is closing)."""


@runtime_checkable
class ContinuousEngine(Engine, Protocol):
    """Continuous batching, as LLM servers run a GPU: a request joins the running batch at the
    engine's next step instead of waiting for a batch window or for the running batch to end.
    One long-lived call per context serves every request the context is given."""

    continuous: bool
    """``True``: the pool drives the engine through :meth:`stream_continuous`."""

    def stream_continuous(self, admit: Admit) -> Iterator[tuple[Hashable, RowItem | None]]:
        """Yield ``(key, chunk)`` as rows produce audio, ``(key, marks)`` (:data:`RowItem`) where
        the engine times words, and ``(key, None)`` once when a row is done (finished or
        cancelled), after everything else of that row; return when ``admit`` returns ``None``. The context hands
        the engine at most ``max_batch`` + ``SPARE_ROWS`` unfinished rows (``workers/pool/continuous_rows.py``);
        the engine runs up to ``max_batch`` of them and keeps the rest waiting for a row."""
        ...


@runtime_checkable
class TimedEngine(Engine, Protocol):
    """An engine that also says when each word is heard (workers/engines/marks.py)."""

    def stream_timed(self, request: SynthesisRequest,
                     cancel: threading.Event) -> Iterator[Pcm | list[WordMark]]:
        """:meth:`Engine.stream`'s chunks, with lists of word marks between them. Every mark comes
        before the chunk that holds its ``start_ms`` where the engine knows it in time (espeak-ng,
        Piper, the synthetic engine); an engine that knows a stretch's words only once its audio
        is made gives them right after it (ChatTTS, per text piece), and the room sends them late.
        Times count from the utterance's first sample (at :attr:`Engine.sample_rate`), offsets
        index ``request.text``. The audio is the same as :meth:`Engine.stream`'s for the same
        request."""
        ...
