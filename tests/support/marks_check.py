"""Word marks against the audio they describe: where sound starts after a silence, and how far the
marks are from it. Shared by tests/engines/test_marks.py and bench/marks_accuracy.py."""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from tests.support.audio import frame_rms
from voxroom.voices.catalog import Voice
from workers.engines.base import SynthesisRequest, TimedEngine
from workers.engines.marks import WordMark

PAUSED = re.compile(r"[.,;:!?。，、；：！？]")
"""Punctuation (and the ``:`` of a ``[pause:ms]``) between two words: the engines pause there."""
LOUD_DBFS = -40.0
"""A 10 ms frame louder than this is sound (as in tests/engines/test_markup.py)."""
GAP_MS = 100.0
"""A silence at least this long is a pause between words, never a stop consonant's closure
(espeak-ng's and Piper's closures measure 30-70 ms, their comma pauses 130 ms and more)."""


@dataclass
class Timed:
    text: str
    audio: npt.NDArray[np.float32]
    marks: list[WordMark]
    rate: int
    late: list[WordMark]
    """Marks that came after the chunk holding their start (the contract says before)."""


def run_timed(engine: TimedEngine, voice: Voice, text: str) -> Timed:
    chunks: list[npt.NDArray[np.float32]] = []
    marks: list[WordMark] = []
    late: list[WordMark] = []
    heard = 0
    for item in engine.stream_timed(SynthesisRequest(text=text, voice=voice, request_id="marks"), threading.Event()):
        if isinstance(item, list):
            marks.extend(item)
            late.extend(m for m in item if round(m.start_ms * engine.sample_rate / 1000) < heard)
        else:
            chunks.append(item)
            heard += item.size
    audio = np.concatenate(chunks) if chunks else np.zeros(0, np.float32)
    return Timed(text, audio, marks, engine.sample_rate, late)


def onsets_ms(audio: npt.NDArray[np.floating], rate: int, gap_ms: float = GAP_MS) -> list[float]:
    """Where sound starts: the first loud frame, and each loud frame after at least ``gap_ms``
    of silence (10 ms frames, 1 ms apart; a frame is placed at its centre)."""
    env = frame_rms(audio, rate, frame_ms=10.0, hop_ms=1.0)
    loud = np.flatnonzero(env > 10 ** (LOUD_DBFS / 20))
    out: list[float] = []
    previous: int | None = None
    for frame in loud:
        if previous is None or frame - previous - 10 >= gap_ms:
            out.append(float(frame) + 5.0)
        previous = int(frame)
    return out


def after_punctuation(timed: Timed, gap_ms: float = GAP_MS) -> list[tuple[WordMark, float]]:
    """The words the engine says after a silence, each with the onset of sound nearest to its
    start: the line's first word and every word written after punctuation or a pause (where
    the engines pause). Other onsets (a word's own stop consonant) are never paired with them
    unless a mark is that far off."""
    onsets = onsets_ms(timed.audio, timed.rate, gap_ms)
    pairs: list[tuple[WordMark, float]] = []
    for previous, mark in zip([None, *timed.marks[:-1]], timed.marks, strict=True):
        between = timed.text[previous.offset + previous.length if previous else 0:mark.offset]
        if (previous is None or PAUSED.search(between)) and onsets:
            pairs.append((mark, min(onsets, key=lambda onset: abs(onset - mark.start_ms))))
    return pairs


def errors_ms(timed: Timed, gap_ms: float = GAP_MS) -> list[float]:
    """``start_ms - onset`` for every word after a silence (positive: the mark is late)."""
    return [mark.start_ms - onset for mark, onset in after_punctuation(timed, gap_ms)]
