"""An open line's text cut into clauses as it arrives (docs/protocol.md, "Lines streamed in").

Pure: text in, ``(offset, clause)`` out. Synthesis starts on each clause as soon as it is whole,
so the prosody is the voice's own within a clause and the first audio comes with the first
clause, not with the line's last word. A clause ends

- after sentence or clause punctuation, English (``. , ; : ! ?``) or Chinese (``。，；：！？、``,
  full-width forms too), with the whitespace that follows it. An ASCII mark must be followed by
  whitespace (``3.5``, ``e.g.x`` and ``10:30`` go on), or end the text received so far: language
  models send the space with the next token (``"Hello."``, ``" The"``), and waiting for it would
  hold every sentence back by one token. A ``.`` right after a digit at the end waits, though: it
  may be a decimal point.
- or, with no such mark, once :data:`MAX_CLAUSE_CHARS` have come: at the last space before that,
  or there (Chinese has no spaces).
- or where the sender asked (a flush, the line's end): everything received so far;
- or, when the line's audio is about to run out while a clause is still being written, at its
  last whole word (:meth:`ClauseSplitter.take_words`): a cut mid-clause rather than silence.

Markup (``[pause:700]``, ``<break time="1s"/>``) is never cut and its characters are never
punctuation. A clause with nothing to say (spaces, a lone mark) waits for the next one, so that
no engine is asked to speak nothing; what remains at the end is returned as it is (the caller
skips it when it has no letter or digit).
"""

from __future__ import annotations

MAX_CLAUSE_CHARS = 60
ASCII_MARKS = frozenset(".,;:!?")
WIDE_MARKS = frozenset("。，；：！？、．｡…")
_OPENERS = {"[": "]", "<": ">"}


def speakable(text: str) -> bool:
    """Has a letter or a digit outside markup (a clause worth an engine call)."""
    depth_end: str | None = None
    for ch in text:
        if depth_end is not None:
            if ch == depth_end:
                depth_end = None
            continue
        if ch in _OPENERS:
            depth_end = _OPENERS[ch]
            continue
        if ch.isalnum():
            return True
    return False


class ClauseSplitter:
    """The text of one open line, received piece by piece; :meth:`take` hands out what is whole."""

    def __init__(self, max_chars: int = MAX_CLAUSE_CHARS) -> None:
        self.max_chars = max_chars
        self._text = ""
        self._start = 0
        """Offset of ``_text``'s first character in the line's whole text."""

    def add(self, text: str, offset: int) -> None:
        """A piece of the line's text, which starts at ``offset`` in the whole text (the pieces
        come in order: a piece's offset is where the last one ended)."""
        if not self._text:
            self._start = offset
        self._text += text

    @property
    def held(self) -> str:
        """What was received and not yet handed out."""
        return self._text

    def take(self, *, everything: bool = False) -> list[tuple[int, str]]:
        """The clauses that are whole now, as ``(offset, text)``; with ``everything`` (a flush,
        the line's end) the rest too, as its last clause."""
        out: list[tuple[int, str]] = []
        while True:
            cut = self._cut()
            if cut is None:
                break
            clause = self._text[:cut]
            if not speakable(clause):
                # Nothing to say yet (", " between two words): it goes with the next clause.
                nxt = self._next_cut_after(cut) if cut < len(self._text) else None
                if nxt is None:
                    break
                cut, clause = nxt, self._text[:nxt]
            out.append((self._start, clause))
            self._start += cut
            self._text = self._text[cut:]
        if everything and self._text:
            out.append((self._start, self._text))
            self._start += len(self._text)
            self._text = ""
        return out

    def take_words(self) -> tuple[int, str] | None:
        """The whole words held, up to the last space outside markup, as one clause; ``None``
        when that has nothing to say. For a line whose audio is about to run out while a long
        clause is still being written (open_line.py): a cut mid-clause is better than silence."""
        closing: str | None = None
        last_space = -1
        for i, ch in enumerate(self._text):
            if closing is not None:
                if ch == closing:
                    closing = None
            elif ch in _OPENERS:
                closing = _OPENERS[ch]
            elif ch.isspace():
                last_space = i
        cut = last_space + 1
        if cut <= 0 or not speakable(self._text[:cut]):
            return None
        out = (self._start, self._text[:cut])
        self._start += cut
        self._text = self._text[cut:]
        return out

    def _next_cut_after(self, at: int) -> int | None:
        rest = ClauseSplitter(self.max_chars)
        rest._text = self._text[at:]
        cut = rest._cut()
        return None if cut is None else at + cut

    def _cut(self) -> int | None:
        """Where the first whole clause of ``_text`` ends, or ``None``."""
        text = self._text
        n = len(text)
        closing: str | None = None
        last_space = -1
        i = 0
        while i < n:
            ch = text[i]
            if closing is not None:
                if ch == closing:
                    closing = None
                i += 1
                continue
            if ch in _OPENERS:
                closing = _OPENERS[ch]
                i += 1
                continue
            if ch in WIDE_MARKS:
                return _after_marks(text, i)
            if ch in ASCII_MARKS:
                end = _after_marks(text, i)
                if end < n and text[end - 1].isspace():
                    return end  # the mark, then whitespace
                if end == n and not (ch == "." and i > 0 and text[i - 1].isdigit()):
                    return end  # the mark ends what came so far
            elif ch.isspace():
                last_space = i
            if i + 1 >= self.max_chars and closing is None:
                return last_space + 1 if last_space > 0 else i + 1
            i += 1
        return None


def _after_marks(text: str, i: int) -> int:
    """The end of the run of marks starting at ``i`` (``?!``, ``...``, ``。」``), with the
    whitespace after it."""
    n = len(text)
    while i < n and (text[i] in ASCII_MARKS or text[i] in WIDE_MARKS or text[i] in "\"')]」』）"):
        i += 1
    while i < n and text[i].isspace():
        i += 1
    return i
