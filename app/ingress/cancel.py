"""A ``cancel`` (issue 30): the lines it names stopped in the room, and the canceller answered.

The room socket (app/room/ws.py) has already parsed the frame and checked that the connection
may speak (a listener's cancel is ``forbidden`` there). Here it becomes a
:class:`voxroom.store.interface.CancelRequest` for the store's ingress, which writes it to Redis
before this answers (a worker that claims the line after a crash sees it cancelled): ``cancelled``
with the room numbers, or an ``error`` (``not_found``, ``forbidden``, ``unavailable``). The room
hears the cut from the workers, through the room's output stream, on every gateway alike.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from voxroom.errors import CancelRefused
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.interface import CancelRequest
from voxroom.wire import protocol
from voxroom.wire.protocol import ErrorCode, ProtocolError

if TYPE_CHECKING:
    from app.fanout.connection import ClientConnection
    from app.state import GatewayState

log = logging.getLogger("voxroom.gateway.ws")


def request_of(msg: protocol.Cancel, client_id: str, *, host: bool) -> CancelRequest:
    if msg.all:
        return CancelRequest("all", None, client_id, host)
    if msg.seq is not None:
        return CancelRequest("seq", msg.seq, client_id, host)
    return CancelRequest("utterance", msg.utterance, client_id, host)


async def cancel_lines(msg: protocol.Cancel, conn: ClientConnection, state: GatewayState, *, host: bool) -> None:
    """Cancel what ``msg`` names and answer on ``conn``. Raises :class:`ProtocolError` for a
    refusal (the caller turns it into the ``error`` message)."""
    request = request_of(msg, conn.client_id, host=host)
    try:
        cancelled = await state.ingress.cancel(conn.room, request)
    except CancelRefused as exc:
        raise ProtocolError(exc.code, str(exc)) from None
    except REDIS_DOWN as exc:
        log.warning("cancel in room %s not stored, redis unavailable: %s", conn.room, exc)
        raise ProtocolError(ErrorCode.UNAVAILABLE, "storage unavailable; cancel again later",
                            retry_after_ms=1000) from None
    log.info("client %s in room %s cancelled %s", conn.client_id, conn.room, cancelled or "nothing")
    conn.send_text(protocol.encode_server_message(protocol.cancelled_message(cancelled)))
