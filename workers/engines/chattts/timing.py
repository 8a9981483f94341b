"""ChatTTS word marks from its own units, the text pieces (``text_split.split_text``).

ChatTTS exposes no alignment between its audio tokens and the text, but it synthesizes a line
piece by piece (a sentence or a clause, at most 120 characters), and the engine knows where in
the row's audio each piece ends. :class:`PieceTimer` turns each finished piece into marks: the
piece's words spread over its voiced audio by syllables (``marks.estimate``), named by their
place in the request's text. Pure (numpy only, no torch): the engine calls it from its decoding
loop, once a piece's last chunk is out, so a piece's marks come after its audio.

Which words a piece holds is found by its characters, not by counting its words: a piece is the
request's text cut and stripped (``split_text``, ``split_for_transition``), so its non-space
characters are the text's next ones, in order, except the closing quotes that a sentence split
drops. The piece's last character, found in the text, is where the piece ends; every word of the
text that starts before it, and after the previous piece's end, is the piece's. The words and
their offsets are the text's own: a word that a hard cut (a run of 120 characters without a
space) splits between two pieces is one word, timed in the piece it starts in, and ChatTTS's
normalizer, which rewrites the piece before the model reads it (numbers, symbols), never sees the
text the marks index.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from workers.engines.marks import WordMark, estimate_audio, split_words


class PieceTimer:
    """One row's marks, piece by piece, in the row's own sample timeline."""

    def __init__(self, text: str, rate: int) -> None:
        self.text = text
        self.rate = rate
        self._words = split_words(text)
        self._next = 0  # the first word of the text not yet given a mark
        self._at = 0  # samples of the row before the current piece
        self._end = 0  # characters of the text the earlier pieces covered

    def piece(self, piece: str, audio: npt.NDArray[np.floating]) -> list[WordMark]:
        """The marks of ``piece`` (a piece of the timer's text, as split, before normalisation),
        whose ``audio`` follows every earlier piece's. Offsets index the timer's text; a piece
        without words (punctuation only) gives none but still moves the time on."""
        self._end = self._find_end(piece)
        words = []
        while self._next < len(self._words) and self._words[self._next].offset < self._end:
            words.append(self._words[self._next])
            self._next += 1
        at_ms = self._at * 1000 / self.rate
        self._at += len(audio)
        if not words:
            return []
        return estimate_audio(self.text, audio, self.rate, at_ms, words)

    def _find_end(self, piece: str) -> int:
        """Where ``piece`` ends in the text: each of its non-space characters found in turn from
        the previous piece's end (a character the text lacks from there on is skipped: it cannot
        move the end past the text)."""
        at = self._end
        for char in piece:
            if char.isspace():
                continue
            found = self.text.find(char, at)
            if found >= 0:
                at = found + 1
        return at
