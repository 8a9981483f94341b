"""What a resuming client holds, and where that puts it in its room's output stream. Pure: no I/O.

A client that reconnects says what it already received, in the WebSocket URL::

    /rooms/R/ws?resume=12.40      utterance 12 up to slice 40 (its start too), not its end
    /rooms/R/ws?resume=12.start   utterance 12's start and no slice of it
    /rooms/R/ws?resume=12.end     all of utterance 12, its end included

A room's output stream is delivered to every client in stream order (``start``, slices and the
``marks`` before them, ``end``, next utterance), so what a client holds is a prefix of the stream,
and its *position* is the last entry of that prefix: the latest entry that is this slice (this
``start``, this ``end``), or holds it (an entry of several slices: docs/protocol.md; the client
then gets that entry's later slices first, :func:`held_slices`). A ``marks`` entry is never a
position: the marks right after the last slice a client holds are replayed to it, those before it
it already has. The gateway finds it by scanning back from the tail (:func:`stop_here` says where
the scan ends) and sends the client everything after it, then live audio (``app/fanout/catchup.py``).

A worker that died mid-utterance makes a second take of it (``start`` with ``restart``, slices from 0
again). Scanning back for the exact slice keeps that right when the client held part of the first
take and the second has not yet reached the same slice index (it gets the restart marker and the
second take whole); when the second take is already past that index the client's position is taken
to be in the second take, and it gets the rest of it without the restart marker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

MAX_UTTERANCE = 2**53 - 1
# ASCII digits only: Python's \d and int() also take "١٢" (Arabic-Indic), which no client writes.
_FORM = re.compile(r"(\d{1,16})\.(start|end|\d{1,9})", re.ASCII)


@dataclass(frozen=True, slots=True)
class ResumePoint:
    utterance: int
    chunk: int
    """The last slice held; -1 when only the utterance's ``start`` is held."""
    has_end: bool = False

    def __str__(self) -> str:
        return f"{self.utterance}.{'end' if self.has_end else 'start' if self.chunk < 0 else self.chunk}"


def parse(value: str) -> ResumePoint:
    """``?resume=`` as sent by a client; ``ValueError`` with a message the client can read."""
    match = _FORM.fullmatch(value)
    if match is None:
        raise ValueError("resume must be <utterance>.<chunk>, <utterance>.start or <utterance>.end")
    utterance, what = int(match[1]), match[2]
    if not 1 <= utterance <= MAX_UTTERANCE:
        raise ValueError("resume utterance out of range")
    if what == "end":
        return ResumePoint(utterance, -1, has_end=True)
    return ResumePoint(utterance, -1 if what == "start" else int(what))


def stop_here(point: ResumePoint, fields: dict[Any, Any]) -> bool:
    """Scanning a room's output stream backwards from its tail: is this entry the client's position
    (the last entry it holds)? An entry of an earlier utterance is (the client's own entries were
    trimmed away: everything after it is news to the client). Entries of the same utterance count
    only when they are exactly what the client named."""
    if b"seq" not in fields:
        # No line's entry (a ``cancel`` or ``piece`` notice for the workers, which no client is
        # sent): never a position. Read as line 0 it once stopped the scan early, and a client
        # resuming across a cancel missed the slices between its position and that notice.
        return False
    seq = int(fields[b"seq"])
    if seq != point.utterance:
        return seq < point.utterance
    kind = fields.get(b"kind")
    if point.has_end:
        return kind == b"end"
    if kind == b"chunk":
        return point.chunk >= 0 and 0 <= point.chunk - int(fields.get(b"chunk", b"-1")) < _slices(fields)
    return kind == b"start" and point.chunk < 0


def held_slices(point: ResumePoint, fields: dict[Any, Any]) -> int:
    """How many of the position's items the client holds, for the entry :func:`stop_here` stopped
    at: all of them (a ``start``, ``end`` or ``marks`` entry is one item: the client has it, and
    is never sent it again) except in a ``chunk`` entry that groups several slices and where the
    client named one before the last (it holds the group's first ones; the rest are news to it)."""
    if fields.get(b"kind") != b"chunk" or int(fields.get(b"seq", b"0")) != point.utterance or point.has_end:
        return _slices(fields)
    return min(_slices(fields), max(0, point.chunk - int(fields.get(b"chunk", b"-1")) + 1))


def _slices(fields: dict[Any, Any]) -> int:
    return int(fields.get(b"slices", b"1"))


def stream_id(entry_id: str | bytes) -> tuple[int, int]:
    """A Redis stream id (``ms-seq``) as a tuple that compares in stream order."""
    text = entry_id.decode() if isinstance(entry_id, bytes) else entry_id
    ms, _, seq = text.partition("-")
    return int(ms), int(seq or 0)
