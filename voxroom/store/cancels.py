"""The room's ``cancel``, written once over :class:`voxroom.store.interface.Commands` for both
Redis modes: one script in the room's slot (voxroom/store/lua/room.py ``_CANCEL``), whose only
difference between the modes is the doorbell it rings (the prelude each mode's ingress passes)."""

from __future__ import annotations

from typing import Any

from voxroom.errors import CancelRefused
from voxroom.store import keys
from voxroom.store.interface import CancelRequest, Commands
from voxroom.wire.protocol import ErrorCode


async def cancel(commands: Commands, script: str, room: str, request: CancelRequest) -> list[int]:
    """Run the cancel script; the room numbers cancelled. Raises :class:`CancelRefused`."""
    reply: Any = await commands.call(
        "EVAL", script, 4, keys.room_state(room), keys.room_utterances(room), keys.room_seq(room),
        keys.room_output(room), request.what, "" if request.number is None else request.number,
        request.client_id, "1" if request.host else "0")
    status = int(reply[0])
    if status == -1:
        raise CancelRefused(ErrorCode.NOT_FOUND, "no such line in this room that has not finished")
    if status == -2:
        raise CancelRefused(ErrorCode.FORBIDDEN, "another client's line: only a host may cancel it")
    return sorted(int(n) for n in reply[1:])
