"""An open line's ``append`` and ``flush`` (docs/protocol.md, "Lines streamed in"): stored, and
answered.

The room socket (app/room/ws.py) has already parsed the frame and checked that the connection may
speak. Here it meets the store's ingress (voxroom/store/lines.py), which writes the piece to Redis
before this answers (a gateway that dies after the answer loses nothing; a part resent after a
reconnect is ``duplicate``, never spoken twice). An ``append`` is answered only when refused: the
room hears the piece itself (a ``text`` message, then its audio). A ``flush`` is answered by the
worker, with ``flushed``, once the audio of what the line held is published.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from voxroom.errors import LineRefused
from voxroom.store.backoff import REDIS_DOWN
from voxroom.wire import protocol
from voxroom.wire.protocol import ErrorCode, ProtocolError

if TYPE_CHECKING:
    from app.fanout.connection import ClientConnection
    from app.state import GatewayState

log = logging.getLogger("voxroom.gateway.ws")


async def append_piece(msg: protocol.Append, conn: ClientConnection, state: GatewayState) -> None:
    """Store ``msg``. Raises :class:`ProtocolError` for every refusal."""
    with _refusals("append", conn.room, msg.seq, "resend this part later"):
        await state.ingress.append(conn.room, conn.client_id, msg.seq, msg.part, msg.text, final=msg.final)


async def flush_line(msg: protocol.Flush, conn: ClientConnection, state: GatewayState) -> None:
    """Store the flush. Raises :class:`ProtocolError` for every refusal."""
    with _refusals("flush", conn.room, msg.seq, "flush again later"):
        await state.ingress.flush(conn.room, conn.client_id, msg.seq)


@contextmanager
def _refusals(what: str, room: str, seq: int, retry: str) -> Iterator[None]:
    """The store's refusals of a piece as the client's errors: its own code, or ``unavailable``."""
    try:
        yield
    except LineRefused as exc:
        raise ProtocolError(exc.code, str(exc), seq=seq) from None
    except REDIS_DOWN as exc:
        log.warning("%s in room %s not stored, redis unavailable: %s", what, room, exc)
        raise ProtocolError(ErrorCode.UNAVAILABLE, f"storage unavailable; {retry}", seq=seq,
                            retry_after_ms=1000) from None
