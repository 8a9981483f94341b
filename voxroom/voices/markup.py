"""The narrator's markup inside ``say`` text: pauses, and nothing else that looks like markup.

Two spellings of one thing, a pause of a given length::

    The night falls. [pause:700] Werewolves, open your eyes.
    The night falls. <break time="700ms"/> Werewolves, open your eyes.   (also time="1s", "1.5s")

Anything else that *looks* like markup is refused rather than read aloud: a bracket whose content
starts with a letter (``[pause]``, ``[foo:1]``, ``[laugh]``), a tag (``<speak>``, ``</s>``,
``<break>`` without ``time``, ``<!-- -->``), an unclosed ``[pause`` / ``<break``, or ``[[`` (which
Piper and espeak-ng would read as raw phonemes). Brackets and
angles that do not look like markup stay text: ``[1]``, ``3 < 5``, ``a < b > c``, ``<3``.

Limits (per line): :data:`MAX_PAUSE_MS` of pause in all, :data:`MAX_PAUSES` pauses. The line's
character limit (``voxroom.wire.protocol.MAX_TEXT_CHARS``) counts the spoken text, markup excluded.

Pure: no I/O, shared by the gateway (which refuses bad markup with ``bad_message``) and the worker
(workers/engines/wrappers.py, which turns pauses into exact silence on every engine).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

MAX_PAUSE_MS: Final = 10_000
"""Total pause per line: a line is a line, not a way to hold the room's clock."""
MAX_PAUSES: Final = 32
"""Each pause splits the line into one more engine call."""

_CANDIDATE: Final = re.compile(r"\[[^\[\]]*\]|<[^<>]*>")
_PAUSE: Final = re.compile(r"\s*pause\s*:\s*(\d{1,6})\s*(?:ms)?\s*", re.IGNORECASE)
_BREAK: Final = re.compile(r"\s*break\s+time\s*=\s*([\"'])\s*(\d{1,6}(?:\.\d{1,3})?)\s*(ms|s)\s*\1\s*/\s*",
                           re.IGNORECASE)
_BRACKET_MARKUP: Final = re.compile(r"\s*[^\W\d_]")
"""A bracket whose content starts with a letter looks like a tag (``[pause]``, ``[laugh]``)."""
_TAG_MARKUP: Final = re.compile(r"[/!?]|[^\W\d_]")
"""A tag opens with a letter, ``/``, ``!`` or ``?`` right after the ``<`` (``a < b > c`` is text)."""
_UNCLOSED: Final = re.compile(r"\[\[|\[\s*pause|<\s*/?\s*(?:break|speak|prosody|emphasis|say-as|phoneme|sub|voice)\b",
                              re.IGNORECASE)


class MarkupError(ValueError):
    """Text holding markup that is not understood, or pauses past the limits. The message names
    the offending piece (at most 40 characters of it) and says what is understood."""


@dataclass(frozen=True, slots=True)
class Pause:
    ms: int


Piece = str | Pause


@dataclass(frozen=True, slots=True)
class Script:
    """A line cut at its pauses: text pieces (stripped, never empty) and pauses (adjacent ones
    merged), in order."""

    pieces: tuple[Piece, ...]

    @property
    def spoken(self) -> str:
        """The words alone, one space where a pause was: what the character limit counts."""
        return " ".join(p for p in self.pieces if isinstance(p, str))

    @property
    def pause_ms(self) -> int:
        return sum(p.ms for p in self.pieces if isinstance(p, Pause))

    @property
    def has_pauses(self) -> bool:
        return any(isinstance(p, Pause) for p in self.pieces)


def _refuse(piece: str) -> MarkupError:
    shown = piece if len(piece) <= 40 else piece[:37] + "..."
    return MarkupError(f"markup {shown!r} is not understood; only pauses are: [pause:500] (milliseconds) "
                       "or <break time=\"500ms\"/> (or time=\"1.5s\"); see docs/voices.md")


def _pause(token: str) -> Pause | None:
    """The pause ``token`` spells, ``None`` when it is text; raises :class:`MarkupError` for
    markup that is not understood."""
    inner = token[1:-1]
    if token[0] == "[":
        if not _BRACKET_MARKUP.match(inner):
            return None
        found = _PAUSE.fullmatch(inner)
        if found is None:
            raise _refuse(token)
        return Pause(int(found.group(1)))
    if not _TAG_MARKUP.match(inner):
        return None
    found = _BREAK.fullmatch(inner)
    if found is None:
        raise _refuse(token)
    value = float(found.group(2))
    return Pause(round(value * 1000 if found.group(3).lower() == "s" else value))


def _text(chunk: str) -> str:
    unclosed = _UNCLOSED.search(chunk)
    if unclosed is not None:
        raise _refuse(chunk[unclosed.start():])
    return chunk


def parse(text: str) -> Script:
    """Cut ``text`` at its pauses. Raises :class:`MarkupError` for markup that is not understood,
    more than :data:`MAX_PAUSES` pauses, or more than :data:`MAX_PAUSE_MS` of pause in all."""
    pieces: list[Piece] = []
    pauses = 0

    def add(piece: Piece) -> None:
        if isinstance(piece, str):
            piece = piece.strip()
            if not piece:
                return
            if pieces and isinstance(pieces[-1], str):
                pieces[-1] = f"{pieces[-1]} {piece}"
                return
        elif pieces and isinstance(pieces[-1], Pause):
            pieces[-1] = Pause(pieces[-1].ms + piece.ms)
            return
        pieces.append(piece)

    last = 0
    for found in _CANDIDATE.finditer(text):
        pause = _pause(found.group())
        if pause is None:
            continue
        add(_text(text[last:found.start()]))
        pauses += 1
        if pauses > MAX_PAUSES:
            raise MarkupError(f"more than {MAX_PAUSES} pauses in one line")
        add(pause)
        last = found.end()
    add(_text(text[last:]))
    script = Script(tuple(pieces))
    if script.pause_ms > MAX_PAUSE_MS:
        raise MarkupError(f"{script.pause_ms} ms of pause in one line; the limit is {MAX_PAUSE_MS} ms")
    return script


def map_words(text: str, words: Callable[[str], str]) -> str:
    """``text`` with ``words`` applied to each stretch between pauses, the pauses kept as written.
    For engines that render the markup themselves. Raises :class:`MarkupError` like :func:`parse`."""
    parse(text)
    out: list[str] = []
    last = 0
    for found in _CANDIDATE.finditer(text):
        if _pause(found.group()) is None:
            continue
        out.extend((words(text[last:found.start()]), found.group()))
        last = found.end()
    out.append(words(text[last:]))
    return "".join(out)
