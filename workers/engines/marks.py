"""Word timings: which word of the line is heard when, relative to the utterance's own audio.

A :class:`WordMark` names one word (one character for Chinese) by its place in the text the engine
was given (``offset``/``length`` in code points: Python ``str`` indices) and its time in the
utterance's audio (``start_ms``/``end_ms`` from the utterance's first sample). The worker turns
these into room-clock times; an engine never knows the room clock.

Where a word is, :func:`split_words` decides for every engine alike: runs of letters and digits
(inner apostrophes, hyphens and decimal points kept) for space-separated scripts, one entry per
Han or kana character, punctuation never a word.

Timing sources, best first: the engine's own positions (espeak-ng's word events, Piper's phoneme
durations), turned into marks by :func:`marks_from_anchors`; otherwise :func:`estimate`, which
spreads the voiced stretch of a piece of audio (its leading and trailing silence found by energy,
:func:`speech_bounds`) over the words in proportion to their syllables, with a short rest after
punctuation. Pure: numpy only, no engine imports.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Final, NamedTuple

import numpy as np
import numpy.typing as npt

SILENCE_DBFS: Final = -45.0
"""Below this short-time RMS a stretch of audio is silence, not a word (as the markup's trimming)."""
FRAME_MS: Final = 5.0
PUNCTUATION_REST: Final = 0.6
"""Syllables' worth of time the estimate leaves after a comma-like mark; twice that after a
sentence end. Measured on Piper joe: a comma's rest is about 0.5-0.8 of a mean syllable."""

_CJK: Final = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f"
"""Han and kana: written without spaces, one mark per character."""
_LETTER: Final = rf"(?:(?![{_CJK}])[^\W_])"
SNAP_MS: Final = 150.0
"""How far :class:`AnchoredStream` moves a word that an engine starts in silence to its first sound."""
WORD: Final = re.compile(rf"[{_CJK}]|{_LETTER}+(?:(?:['’\-]|(?<=\d)[.,:](?=\d)){_LETTER}+)*")
_SENTENCE_END: Final = re.compile(r"[.!?。！？…]")
_CLAUSE_END: Final = re.compile(r"[,;:，、；：—–]")
_VOWELS: Final = re.compile(r"[aeiouyàáâãäåæèéêëìíîïòóôõöøùúûüýÿœ]+", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class WordMark:
    """One word of the line and when it is heard."""

    text: str
    offset: int
    """Code points before the word in the text the engine was given (a wrapper maps it to the line)."""
    length: int
    start_ms: float
    """From the utterance's first sample."""
    end_ms: float

    def shifted(self, ms: float = 0.0, chars: int = 0) -> WordMark:
        return replace(self, offset=self.offset + chars, start_ms=self.start_ms + ms, end_ms=self.end_ms + ms)


class Word(NamedTuple):
    offset: int
    length: int
    text: str


def split_words(text: str) -> list[Word]:
    """The words of ``text`` in order (one per Han/kana character), punctuation left out."""
    return [Word(m.start(), m.end() - m.start(), m.group()) for m in WORD.finditer(text)]


def syllables(word: str) -> float:
    """A rough syllable count, the estimate's weight: vowel groups for alphabetic words (a
    silent final ``e`` dropped), one per Han/kana character, about one per two characters for
    scripts without Latin vowels, and about two per digit (digits are read as words)."""
    if re.fullmatch(f"[{_CJK}]", word):
        return 1.0
    digits = sum(c.isdigit() for c in word)
    letters = "".join(c for c in word if c.isalpha())
    groups = len(_VOWELS.findall(letters))
    if groups > 1 and letters.lower().endswith("e") and not letters.lower().endswith(("le", "ee")):
        groups -= 1
    if not groups and letters:
        groups = max(1, round(len(letters) / 2)) if not letters.isascii() else 1
    return float(max(1.0, groups + 2 * digits))


def _rest_after(text: str, end: int, next_start: int) -> float:
    gap = text[end:next_start]
    if _SENTENCE_END.search(gap):
        return 2 * PUNCTUATION_REST
    if _CLAUSE_END.search(gap):
        return PUNCTUATION_REST
    return 0.0


def speech_bounds(audio: npt.NDArray[np.floating], rate: int,
                  silence_dbfs: float = SILENCE_DBFS) -> tuple[int, int] | None:
    """``(first, end)`` samples of the stretch between the first and the last loud 5 ms frame;
    ``None`` when all of it is silence."""
    frame = max(1, int(rate * FRAME_MS / 1000))
    a = np.asarray(audio, dtype=np.float64)
    n = a.size // frame
    if n == 0:
        return None
    power = np.mean(a[:n * frame].reshape(n, frame) ** 2, axis=1)
    loud = np.flatnonzero(power > 10 ** (silence_dbfs / 10))
    if loud.size == 0:
        return None
    return int(loud[0]) * frame, min(a.size, (int(loud[-1]) + 1) * frame)


def estimate(text: str, start_ms: float, end_ms: float, words: Sequence[Word] | None = None) -> list[WordMark]:
    """Spread ``[start_ms, end_ms)`` over the words of ``text`` (or the given ``words`` of it) in
    proportion to :func:`syllables`, leaving :data:`PUNCTUATION_REST` after punctuation between
    words. Monotone, within the span, the words in text order."""
    words = list(split_words(text) if words is None else words)
    if not words:
        return []
    weights = [syllables(w.text) for w in words]
    rests = [_rest_after(text, a.offset + a.length, b.offset) for a, b in itertools.pairwise(words)] + [0.0]
    total = sum(weights) + sum(rests)
    scale = max(0.0, end_ms - start_ms) / total
    marks: list[WordMark] = []
    t = start_ms
    for word, weight, rest in zip(words, weights, rests, strict=True):
        end = t + weight * scale
        marks.append(WordMark(word.text, word.offset, word.length, t, end))
        t = end + rest * scale
    return marks


def estimate_audio(text: str, audio: npt.NDArray[np.floating], rate: int, at_ms: float = 0.0,
                   words: Sequence[Word] | None = None) -> list[WordMark]:
    """:func:`estimate` over the voiced stretch of ``audio`` (a piece that starts ``at_ms`` into
    the utterance); the whole piece when it is all silence."""
    bounds = speech_bounds(audio, rate) or (0, len(audio))
    return estimate(text, at_ms + bounds[0] * 1000 / rate, at_ms + bounds[1] * 1000 / rate, words)


class Anchor(NamedTuple):
    """An engine's own word position: text from ``offset`` for ``length`` code points is heard
    from ``sample`` on."""

    offset: int
    length: int
    sample: int


def _anchored_starts(text: str, words: Sequence[Word], anchors: Sequence[Anchor]) -> tuple[list[int], int]:
    """Each word's start sample, and how many words lie before the last one whose own text an
    anchor covers (their times can no longer change as more anchors come)."""
    # Per character: the first anchor (in time) that covers it, and the last one (in time) that
    # begins at or before it; linear in the text and the anchors.
    covering: list[int | None] = [None] * (len(text) + 1)
    latest: list[int] = [-1] * (len(text) + 1)
    for index, anchor in enumerate(anchors):
        lo = min(max(0, anchor.offset), len(text))
        for pos in range(lo, min(len(text), lo + max(1, anchor.length))):
            if covering[pos] is None:
                covering[pos] = anchor.sample
        latest[lo] = max(latest[lo], index)
    for pos in range(1, len(latest)):
        latest[pos] = max(latest[pos], latest[pos - 1])
    starts: list[int | None] = []
    settled = 0
    for i, word in enumerate(words):
        found = covering[word.offset]
        if found is not None:
            settled = i
        elif latest[word.offset] >= 0:
            found = anchors[latest[word.offset]].sample
        starts.append(found)
    first = next((s for s in starts if s is not None), 0)
    samples = [first if s is None else s for s in starts]
    for i in range(1, len(samples)):  # words are heard in text order
        samples[i] = max(samples[i], samples[i - 1])
    return samples, settled


def marks_from_anchors(text: str, anchors: Iterable[Anchor], rate: int, end_sample: int) -> list[WordMark]:
    """Marks for the words of ``text`` from an engine's word positions, in time order.

    A word takes the time of the first anchor whose text covers its first character, else of
    the last anchor before it (an engine may read two words as one, or one word as several: a
    number's digits). Words that share an anchor split the time until the next word's anchor by
    :func:`syllables`. A word ends where the next word starts; the last one at ``end_sample``."""
    return _marks(text, split_words(text), list(anchors), rate, end_sample)[0]


def _marks(text: str, words: Sequence[Word], anchors: Sequence[Anchor], rate: int,
           end_sample: int) -> tuple[list[WordMark], int]:
    if not words:
        return [], 0
    if not anchors:
        return estimate(text, 0.0, end_sample * 1000 / rate, words), 0
    samples, settled = _anchored_starts(text, words, anchors)
    marks: list[WordMark] = []
    i = 0
    while i < len(words):
        j = i
        while j + 1 < len(words) and samples[j + 1] == samples[i]:
            j += 1
        group_end = samples[j + 1] if j + 1 < len(words) else max(end_sample, samples[i])
        marks.extend(estimate(text, samples[i] * 1000 / rate, group_end * 1000 / rate, words[i:j + 1]))
        i = j + 1
    for k in range(len(marks) - 1):  # a word lasts until the next one starts
        marks[k] = replace(marks[k], end_ms=max(marks[k].start_ms, marks[k + 1].start_ms))
    # Words before the last settled one are final, unless they share its start (its group may grow).
    while settled > 0 and samples[settled - 1] == samples[settled]:
        settled -= 1
    return marks, settled


class AnchoredStream:
    """An engine's audio chunks and word anchors in, the same audio with final marks out, every
    mark before the chunk that holds its start.

    A word's mark is final once a later word's anchor has come (it ends there) or the stream has
    ended; audio is held back only until the marks of the words that start in it are final.
    Feed with :meth:`anchors` and :meth:`audio`, take :meth:`ready` whenever the engine has nothing
    more at hand, :meth:`finish` at the end."""

    def __init__(self, text: str, rate: int) -> None:
        self.text = text
        self.rate = rate
        self._anchors: list[Anchor] = []
        self._held: list[npt.NDArray[np.float32]] = []
        self._held_from = 0  # sample index of the first held chunk
        self._samples = 0
        self._sent = 0  # marks already given out
        self._words = split_words(text)

    def anchors(self, anchors: Iterable[Anchor]) -> None:
        self._anchors.extend(anchors)

    def audio(self, chunk: npt.NDArray[np.float32]) -> None:
        self._held.append(chunk)
        self._samples += chunk.size

    def _out(self, marks: list[WordMark], upto: int | None) -> list[npt.NDArray[np.float32] | list[WordMark]]:
        out: list[npt.NDArray[np.float32] | list[WordMark]] = []
        if len(marks) > self._sent:
            out.append(self._to_sound(marks[self._sent:]))
            self._sent = len(marks)
        while self._held and (upto is None or self._held_from + self._held[0].size <= upto):
            chunk = self._held.pop(0)
            self._held_from += chunk.size
            out.append(chunk)
        return out

    def _to_sound(self, marks: list[WordMark]) -> list[WordMark]:
        """Each word that the engine starts in silence (a stop's closure, the lead-in) moved to
        its first sound, when that comes within :data:`SNAP_MS` and before the next word: a
        listener hears the word begin there. The words start in audio still held."""
        if not self._held:
            return marks
        audio = np.concatenate(self._held)
        out: list[WordMark] = []
        for k, mark in enumerate(marks):
            first = round(mark.start_ms * self.rate / 1000) - self._held_from
            limit_ms = min(mark.start_ms + SNAP_MS, marks[k + 1].start_ms if k + 1 < len(marks) else mark.end_ms)
            last = round(limit_ms * self.rate / 1000) - self._held_from
            bounds = speech_bounds(audio[max(0, first):max(0, last)], self.rate) if first >= 0 else None
            if bounds is not None and bounds[0] > 0:
                mark = replace(mark, start_ms=mark.start_ms + bounds[0] * 1000 / self.rate)
            out.append(mark)
        return out

    def ready(self) -> list[npt.NDArray[np.float32] | list[WordMark]]:
        """What can go out now: final marks, then the chunks before the first word still open."""
        if not self._anchors:
            return []
        marks, settled = _marks(self.text, self._words, self._anchors, self.rate, self._samples)
        upto = math.floor(marks[settled].start_ms * self.rate / 1000) if marks else 0
        return self._out(marks[:settled], upto)

    def finish(self) -> list[npt.NDArray[np.float32] | list[WordMark]]:
        """Everything left: the last words end where the held audio's sound ends."""
        end = self._samples
        if self._held:
            bounds = speech_bounds(np.concatenate(self._held), self.rate)
            end = self._held_from + bounds[1] if bounds is not None else self._held_from
        last = max((a.sample for a in self._anchors), default=0)
        marks = _marks(self.text, self._words, self._anchors, self.rate, max(end, last))[0]
        return self._out(marks, None)


@dataclass(frozen=True, slots=True)
class Rewrite:
    """``original[offset:offset+length]`` was replaced by ``new_length`` code points at
    ``new_offset`` of the rewritten text (the lexicon's respellings)."""

    offset: int
    length: int
    new_offset: int
    new_length: int


def map_back(marks: Sequence[WordMark], original: str, rewrites: Sequence[Rewrite]) -> list[WordMark]:
    """Marks of a rewritten text as marks of ``original``.

    Outside the rewrites a mark only moves by the length change before it. Inside one, the
    marks become the original words when there are as many (a respelling word for word), else
    one mark that spans the whole original phrase, from the first mark's start to the last one's
    end: exact at the granularity the rewrite allows."""
    out: list[WordMark] = []
    shift = 0
    pending: list[WordMark] = []
    current: Rewrite | None = None
    spans = iter(rewrites)
    nxt = next(spans, None)

    def flush() -> None:
        nonlocal current
        if current is not None and pending:
            words = split_words(original[current.offset:current.offset + current.length])
            if len(words) == len(pending):
                out.extend(WordMark(w.text, current.offset + w.offset, w.length, m.start_ms, m.end_ms)
                           for w, m in zip(words, pending, strict=True))
            else:
                text = original[current.offset:current.offset + current.length]
                out.append(WordMark(text, current.offset, current.length, pending[0].start_ms,
                                    max(m.end_ms for m in pending)))
        pending.clear()
        current = None

    for mark in marks:
        while nxt is not None and mark.offset >= nxt.new_offset + nxt.new_length:
            flush()
            shift = nxt.offset + nxt.length - (nxt.new_offset + nxt.new_length)
            nxt = next(spans, None)
        if nxt is not None and mark.offset >= nxt.new_offset:
            if current is not nxt:
                flush()
                current = nxt
            pending.append(mark)
            continue
        flush()
        out.append(replace(mark, offset=mark.offset + shift))
    flush()
    return out
