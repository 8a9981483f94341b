"""ChatTTS word marks from its own units, the text pieces (``text_split.split_text``).

ChatTTS exposes no alignment between its audio tokens and the text, but it synthesizes a line
piece by piece (a sentence or a clause, at most 120 characters), and the engine knows where in
the row's audio each piece ends. :class:`PieceTimer` turns each finished piece into marks: the
piece's words spread over its voiced audio by syllables (``marks.estimate_audio``), named by
their place in the request's text. Pure (numpy only, no torch): the engine calls it from its
decoding loop.

The pieces keep every non-space character of the text in order (``split_text``'s promise), so
the piece's words are the text's next words, one for one.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from workers.engines.marks import WordMark, estimate_audio, split_words


class PieceTimer:
    """One row's marks, piece by piece, in the row's own sample timeline."""

    def __init__(self, text: str, rate: int) -> None:
        self.rate = rate
        self._words = split_words(text)
        self._next = 0  # the first word of the text not yet given a mark
        self._at = 0  # samples of the row before the current piece

    def piece(self, piece: str, audio: npt.NDArray[np.floating]) -> list[WordMark]:
        """The marks of ``piece``, whose ``audio`` follows every earlier piece's. Offsets index
        the text the timer was made with; a piece's words beyond the text's are dropped."""
        guessed = estimate_audio(piece, audio, self.rate, self._at * 1000 / self.rate)
        self._at += len(audio)
        out: list[WordMark] = []
        for mark in guessed:
            if self._next >= len(self._words):
                break
            word = self._words[self._next]
            self._next += 1
            out.append(WordMark(word.text, word.offset, word.length, mark.start_ms, mark.end_ms))
        return out
