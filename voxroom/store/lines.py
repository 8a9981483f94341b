"""An open line's ``append`` and ``flush``, written once over
:class:`voxroom.store.interface.Commands` for both Redis modes: one script each in the room's slot
(voxroom/store/lua/lines.py), whose only difference between the modes is the doorbell it rings (the
prelude each mode's ingress passes)."""

from __future__ import annotations

from typing import Any

from voxroom.errors import LineRefused
from voxroom.store import keys
from voxroom.store.interface import Commands
from voxroom.wire.protocol import MAX_LINE_PARTS, MAX_OPEN_LINE_CHARS, ErrorCode

MAX_ENTRIES = MAX_LINE_PARTS + 64
"""A line's pieces stream holds at most this many entries: its parts, its flushes, its close."""


async def append(commands: Commands, script: str, room: str, sender: str, client_seq: int, part: int, text: str,
                 *, final: bool, ttl_s: int) -> int:
    """Store part ``part`` of ``sender``'s open line ``client_seq``; its offset in the line's text.
    Raises :class:`LineRefused` (``duplicate``, ``not_found``, ``bad_message`` for a gap,
    ``text_too_long``), or one of ``REDIS_DOWN``."""
    reply: Any = await commands.call(
        "EVAL", script, 2, keys.open_line(room, sender, client_seq), keys.room_output(room),
        part, text, "1" if final else "0", len(text), MAX_OPEN_LINE_CHARS, MAX_ENTRIES, ttl_s)
    status = int(reply[0])
    if status == 1:
        return int(reply[1])
    if status == 0:
        raise LineRefused(ErrorCode.DUPLICATE, f"part {part} of line {client_seq} already stored "
                          f"(last {int(reply[1])}); ignored")
    if status == -1:
        raise LineRefused(ErrorCode.NOT_FOUND, f"no open line with seq {client_seq} from this client")
    if status == -2:
        raise LineRefused(ErrorCode.BAD_MESSAGE, f"part {part} of line {client_seq} leaves a gap: the next "
                          f"part is {int(reply[1]) + 1}")
    if status == -3:
        raise LineRefused(ErrorCode.NOT_FOUND, f"line {client_seq} is closed (its last part was "
                          f"{int(reply[1])})")
    if status == -4:
        raise LineRefused(ErrorCode.TEXT_TOO_LONG, f"line {client_seq} would pass {MAX_OPEN_LINE_CHARS} "
                          "characters")
    raise LineRefused(ErrorCode.TEXT_TOO_LONG, f"line {client_seq} has {MAX_ENTRIES} pieces already")


async def flush(commands: Commands, script: str, room: str, sender: str, client_seq: int, *, ttl_s: int) -> int:
    """Ask for ``sender``'s open line ``client_seq`` to be spoken through what it holds now; the
    last part it holds (the ``flushed`` answer names it). Raises :class:`LineRefused`
    (``not_found``, ``text_too_long`` for too many pieces), or one of ``REDIS_DOWN``."""
    reply: Any = await commands.call("EVAL", script, 2, keys.open_line(room, sender, client_seq),
                                     keys.room_output(room), MAX_ENTRIES, ttl_s)
    status = int(reply[0])
    if status == 1:
        return int(reply[1])
    if status == -1:
        raise LineRefused(ErrorCode.NOT_FOUND, f"no open line with seq {client_seq} from this client")
    raise LineRefused(ErrorCode.TEXT_TOO_LONG, f"line {client_seq} has {MAX_ENTRIES} pieces already")
