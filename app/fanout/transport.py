"""The TCP connection under a WebSocket (or a speech response), for the three things ASGI gives no
way to do.

1. **Bound the kernel's send buffer** (``settings.send_buffer_bytes``): left to autotuning, a
   loopback socket takes 3 MB (a minute of PCM) before a client that stopped reading even shows as
   stalled, and holds that much kernel memory per stalled client.
2. **Abort** a connection whose client stopped reading: uvicorn's WebSocket send waits for its
   transport to be writable with no deadline, and a close goes through the same wait, so such a
   client can only be let go by aborting the transport (which also ends the endpoint's receive
   with a disconnect).
3. **Write several messages in one transport write** (:class:`BatchSend`): an ASGI ``send`` is
   one WebSocket frame and one socket write. A client's writer (app/fanout/connection.py) often holds
   more than one message when it wakes (a line's ``start`` and its first audio frame, a paced
   pair of slices), and one ``send()`` system call for all of them costs the gateway a syscall
   less per extra frame and wakes the client once instead of once per frame.

ASGI hands the application no transport, but uvicorn's ``send`` callable is a method of its
protocol object, which holds one. :class:`TransportTap`, the outermost middleware, sees that
``send`` before Starlette wraps it (an HTTP request's ``receive``: Starlette wraps its ``send``
first) and puts the transport in the connection's scope. HTTP requests
get it too: a ``POST /v1/audio/speech`` response bounds its send buffer and aborts a client that
stopped reading the same way (1, 2), and ends a response it cannot finish without the terminating
chunk (app/api/speech_stream.py).
"""

from __future__ import annotations

import contextlib
import logging
import socket
from typing import Any

from starlette.requests import HTTPConnection
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

log = logging.getLogger("voxroom.gateway.transport")

SCOPE_KEY = "voxroom.transport"
PROTOCOL_KEY = "voxroom.ws_protocol"


class TransportTap:
    """ASGI middleware: ``scope["voxroom.transport"]`` for WebSocket connections and HTTP requests
    (None when the server is not uvicorn); ``scope["voxroom.ws_protocol"]`` for WebSockets."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            protocol = getattr(send, "__self__", None)
            scope[SCOPE_KEY] = getattr(protocol, "transport", None)
            scope[PROTOCOL_KEY] = protocol
        elif scope["type"] == "http":
            # Starlette's outermost middleware (ServerErrorMiddleware) has wrapped an HTTP request's
            # send by now, not its receive: uvicorn's request cycle, which holds the transport.
            scope[SCOPE_KEY] = getattr(getattr(receive, "__self__", None), "transport", None)
        await self.app(scope, receive, send)


def transport_of(connection: HTTPConnection) -> Any:
    return connection.scope.get(SCOPE_KEY)


def limit_send_buffer(connection: HTTPConnection, nbytes: int) -> None:
    """Bound the kernel's send buffer of this connection (Linux doubles ``nbytes``)."""
    limit_transport_send_buffer(transport_of(connection), nbytes)


def limit_transport_send_buffer(transport: Any, nbytes: int) -> None:
    """:func:`limit_send_buffer` for the transport itself (``None``: nothing to do)."""
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


class BatchSend:
    """Several WebSocket messages of one connection framed together and written with one
    ``transport.write``, through the sans-I/O connection of uvicorn's ``websockets-sansio``
    protocol (what ``voxroom gateway`` runs: uvicorn's ``ws="auto"`` with websockets installed).
    Each message is framed by websockets exactly as uvicorn's ``send`` frames it
    (``send_binary``/``send_text`` then ``data_to_send``), in order; only the writes are merged.

    :meth:`of` returns ``None`` for any other server or WebSocket implementation, and
    :meth:`ready` is false whenever uvicorn's own ``send`` would do something else than frame and
    write (the handshake not complete, a close sent, the peer gone, flow control paused) or the
    transport already holds unsent bytes (a client not keeping up): the caller then sends one
    message at a time through ASGI, which waits, raises and closes as before.
    """

    __slots__ = ("_conn", "_protocol", "_transport", "_websocket")

    def __init__(self, websocket: WebSocket, protocol: Any) -> None:
        self._websocket = websocket
        self._protocol = protocol
        self._conn = protocol.conn
        self._transport = protocol.transport

    @classmethod
    def of(cls, websocket: WebSocket) -> BatchSend | None:
        protocol = websocket.scope.get(PROTOCOL_KEY)
        conn = getattr(protocol, "conn", None)
        needed = ("send_binary", "send_text", "data_to_send")
        if (conn is None or not all(callable(getattr(conn, name, None)) for name in needed)
                or not all(hasattr(protocol, name) for name in
                           ("transport", "writable", "disconnected", "close_sent", "handshake_complete",
                            "initial_response"))):
            return None
        return cls(websocket, protocol)

    def ready(self) -> bool:
        """Whether :meth:`write` may be used now (see the class docstring)."""
        p = self._protocol
        return (self._websocket.application_state == WebSocketState.CONNECTED and p.handshake_complete
                and p.initial_response is None and not p.close_sent and not p.disconnected
                and p.writable.is_set() and not self._transport.is_closing()
                and self._transport.get_write_buffer_size() == 0)

    def write(self, items: list[str | bytes]) -> None:
        """Frame ``items`` in order (``str`` a text message, ``bytes`` a binary one) and write
        them at once. Call only right after :meth:`ready` said yes, with no await in between.
        Raises ``WebSocketDisconnect(1006)`` when the connection is no longer open, as
        Starlette's ``send`` does for uvicorn's ``ClientDisconnected``."""
        conn = self._conn
        try:
            for item in items:
                if isinstance(item, bytes):
                    conn.send_binary(item)
                else:
                    conn.send_text(item.encode())
        except AssertionError as exc:  # websockets' InvalidState: the connection is closing
            self._websocket.application_state = WebSocketState.DISCONNECTED
            raise WebSocketDisconnect(code=1006) from exc
        self._transport.write(b"".join(conn.data_to_send()))
