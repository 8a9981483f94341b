"""The TCP connection under a WebSocket, for the two things ASGI gives no way to do.

1. **Bound the kernel's send buffer** (``settings.send_buffer_bytes``): left to autotuning, a
   loopback socket takes 3 MB (a minute of PCM) before a client that stopped reading even shows as
   stalled, and holds that much kernel memory per stalled client.
2. **Abort** a connection whose client stopped reading: uvicorn's WebSocket send waits for its
   transport to be writable with no deadline, and a close goes through the same wait, so such a
   client can only be let go by aborting the transport (which also ends the endpoint's receive
   with a disconnect).

ASGI hands the application no transport, but uvicorn's ``send`` callable is a method of its
protocol object, which holds one. :class:`TransportTap`, the outermost middleware, sees that
``send`` before Starlette wraps it and puts the transport in the connection's scope.
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any

from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

log = logging.getLogger("voxroom.gateway.transport")

SCOPE_KEY = "voxroom.transport"


class TransportTap:
    """ASGI middleware: ``scope["voxroom.transport"]`` for WebSocket connections (None when the
    server is not uvicorn)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            scope[SCOPE_KEY] = getattr(getattr(send, "__self__", None), "transport", None)
        await self.app(scope, receive, send)


def transport_of(websocket: WebSocket) -> Any:
    return websocket.scope.get(SCOPE_KEY)


def limit_send_buffer(websocket: WebSocket, nbytes: int) -> None:
    """Bound the kernel's send buffer of this connection (Linux doubles ``nbytes``)."""
    transport = transport_of(websocket)
    sock = transport.get_extra_info("socket") if transport is not None else None
    if nbytes > 0 and sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, nbytes)


def abort(websocket: WebSocket) -> None:
    """Drop the TCP connection under ``websocket`` at once."""
    transport = transport_of(websocket)
    if transport is not None and hasattr(transport, "abort"):
        transport.abort()
    else:
        log.warning("cannot abort a stalled connection: no transport in its scope")
