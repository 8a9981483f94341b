"""A synthetic engine with a fixed time to first chunk and real-time factor.

A benchmark fixture, never a default: it lets ``bench/`` measure the server rather than a
CPU-bound voice. Its audio is a buzz (a harmonic source at a speech-like pitch) whose loudness is
modulated at a syllable rate, so that audio checks see something speech-shaped, and whose length
follows the text (about 14 characters a second, a typical speaking rate).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Hashable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from workers.engines.base import Admit, Pcm, SynthesisRequest
from workers.engines.marks import WordMark, estimate_audio

CHARS_PER_SECOND = 14.0
MAX_SECONDS = 40.0  # 500 characters at 14 a second


@functools.cache
def _buzz(rate: int, seconds: float) -> Pcm:
    """Computed once per process and shared read-only by every instance (one per context)."""
    t = np.arange(int(rate * seconds), dtype=np.float64) / rate
    pitch = 110.0 + 20.0 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / rate
    source = sum(np.sin(k * phase) / k for k in range(1, 8))
    envelope = 0.5 * (1 - np.cos(2 * np.pi * 4.0 * t))  # 4 syllables a second
    audio: Pcm = (0.25 * source * envelope).astype(np.float32)
    return audio


class SyntheticEngine:
    """``max_batch`` > 1 makes it a batch engine (as ChatTTS on a GPU is): one wait of ``ttfc_ms``
    for the whole batch, then every row's chunks, so that many rooms can be served from a few
    contexts (threads) the way a real deployment would."""

    name = "synthetic"

    def __init__(self, *, ttfc_ms: float = 50.0, rtf: float = 0.05, chunk_ms: float = 200.0,
                 sample_rate: int = 24_000, max_batch: int = 1, continuous: bool = False) -> None:
        self.max_batch = max_batch
        self.continuous = continuous
        """With ``max_batch`` > 1: rows join at any moment (continuous batching, see
        :class:`workers.engines.base.ContinuousEngine`), each with its own ``ttfc_ms``."""
        self.sample_rate = sample_rate
        self.ttfc_s = ttfc_ms / 1000
        self.rtf = rtf
        self.chunk_samples = int(sample_rate * chunk_ms / 1000)
        self._buzz = _buzz(sample_rate, MAX_SECONDS)

    def load(self, device: str) -> None:
        del device

    def duration_s(self, text: str) -> float:
        return max(0.4, len(text) / CHARS_PER_SECOND)

    def _audio(self, text: str) -> Pcm:
        """A view of the precomputed buzz, as long as the text: the engine itself costs no CPU
        per request (it stands for a GPU), so a benchmark's CPU goes to the server."""
        total = min(int(self.duration_s(text) * self.sample_rate), self._buzz.size)
        return self._buzz[:total]

    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm]:
        audio = self._audio(request.text)
        total = audio.size
        if cancel.wait(self.ttfc_s):
            return
        for start in range(0, total, self.chunk_samples):
            chunk = audio[start:start + self.chunk_samples]
            # Sleep the compute the real-time factor stands for, so the pacing downstream is real.
            if start and cancel.wait(chunk.size / self.sample_rate * self.rtf):
                return
            if cancel.is_set():
                return
            yield chunk

    def stream_timed(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm | list[WordMark]]:
        """:meth:`stream`, after the marks of every word: the whole buzz is known up front, so
        the estimate (``marks.estimate_audio``: syllables over the sounding stretch) comes first."""
        marks = estimate_audio(request.text, self._audio(request.text), self.sample_rate)
        for index, chunk in enumerate(self.stream(request, cancel)):
            if index == 0 and marks:
                yield marks
            yield chunk

    def stream_batch(self, requests: Sequence[SynthesisRequest],
                     cancel: Sequence[threading.Event]) -> Iterator[tuple[int, Pcm]]:
        audios = [self._audio(r.text) for r in requests]
        time.sleep(self.ttfc_s)
        longest = max(a.size for a in audios)
        for start in range(0, longest, self.chunk_samples):
            if start:
                time.sleep(self.chunk_samples / self.sample_rate * self.rtf)
            for row, audio in enumerate(audios):
                if start < audio.size and not cancel[row].is_set():
                    yield row, audio[start:start + self.chunk_samples]

    def stream_continuous(self, admit: Admit) -> Iterator[tuple[Hashable, Pcm | None]]:
        """Every row on its own clock: first chunk ``ttfc_ms`` after it was admitted, then one
        chunk per ``chunk_ms x rtf``. The thread sleeps until the next row is due or a request
        arrives, whichever is first: one wake-up serves every row due at that moment."""
        rows: dict[Hashable, _Row] = {}
        while True:
            due = min((row.due for row in rows.values()), default=None)
            wait = None if due is None else max(0.0, due - time.monotonic())
            admitted = admit(wait)
            if admitted is None:
                return
            for key, request, cancel in admitted:
                audio = self._audio(request.text)
                rows[key] = _Row(audio, 0, time.monotonic() + self.ttfc_s, cancel)
            now = time.monotonic()
            for key, row in list(rows.items()):
                if row.cancel.is_set():
                    del rows[key]
                    yield key, None
                    continue
                if row.due > now:
                    continue
                chunk = row.audio[row.pos:row.pos + self.chunk_samples]
                row.pos += chunk.size
                yield key, chunk
                if row.pos >= row.audio.size:
                    del rows[key]
                    yield key, None
                else:  # from the row's own schedule, not from now: a late wake-up does not drift
                    row.due += chunk.size / self.sample_rate * self.rtf

    def close(self) -> None:
        pass


@dataclass(slots=True)
class _Row:
    audio: Pcm
    pos: int
    due: float
    """Monotonic time its next chunk is ready."""
    cancel: threading.Event


