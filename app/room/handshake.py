"""A deadline on request headers (slowloris): uvicorn's HTTP protocol, with a timer.

uvicorn times out idle keep-alive connections, but not a request whose headers never finish: 1,500
half-open WebSocket upgrades, each sending a byte now and then, all stayed open (3,533 fds). Here
a timer starts when the connection opens (and when a later request on it begins) and is cancelled
when the request's headers are complete; when it fires first, the connection is closed. A
WebSocket upgrade is an HTTP request until its headers are complete, so it is covered too; what
follows the headers (a body, the WebSocket itself) has limits of its own.

An upgrade request whose headers are complete can still be one that websockets refuses inside its
parser: a request line or a header line over 8 KiB (414, 431), more than 128 headers (431), a
body. websockets puts its answer in its outgoing buffer, and uvicorn's sans-I/O adapter writes that
buffer only after a request it could parse: the answer was never sent and the socket never closed
(300 of 300 such sockets held, outside the per-address cap and the connection gauge). Here the
answer is written and the connection closed at once, and every refusal is counted in
``voxroom_handshakes_refused_total{reason}``, header deadlines included.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from voxroom.runtime.metrics import HANDSHAKES_REFUSED

log = logging.getLogger("voxroom.gateway.handshake")

_BAD_REQUEST_BODY = b"not a WebSocket upgrade request this server takes\n"
_BAD_REQUEST = (b"HTTP/1.1 400 Bad Request\r\ncontent-type: text/plain; charset=utf-8\r\n"
                b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_BAD_REQUEST_BODY), _BAD_REQUEST_BODY))


def _refusal_reason(exc: BaseException) -> str:
    """The ``reason`` label for what websockets' request parser raised."""
    try:
        from websockets.exceptions import HeaderLineTooLong, RequestLineTooLong, TooManyHeaders
    except ImportError:
        return "bad_request"
    if isinstance(exc, RequestLineTooLong):
        return "uri_too_long"
    if isinstance(exc, HeaderLineTooLong | TooManyHeaders):
        return "headers_too_large"
    return "bad_request"


def answer_refused_upgrade(transport: Any) -> str | None:
    """After uvicorn handed ``transport`` to its WebSocket protocol: when websockets refused the
    request while parsing it, write its answer (414, 431; a 400 where it has none) and close.
    Returns the refusal's reason, or None when the request was taken."""
    conn = getattr(transport.get_protocol(), "conn", None)  # websockets' ServerProtocol (sans-I/O)
    exc = getattr(conn, "handshake_exc", None)
    if conn is None or exc is None:
        return None
    reason = _refusal_reason(exc)
    # uvicorn 0.55 writes websockets' answer and closes by itself; earlier ones left it buffered.
    # Either way it is a refusal, and counted once (this runs once per upgrade).
    if not transport.is_closing():
        answer = b"".join(conn.data_to_send())  # websockets ends it with b"" (its EOF mark): harmless
        # close, not abort: the answer is a few hundred bytes, the kernel takes it at once.
        transport.write(answer if answer.strip() else _BAD_REQUEST)
        transport.close()
    HANDSHAKES_REFUSED.labels(reason).inc()
    return reason


def deadline_protocol(timeout_s: float) -> type[asyncio.Protocol] | str:
    """The HTTP protocol class to pass as ``uvicorn.Config(http=...)``: uvicorn's httptools protocol
    with a header deadline of ``timeout_s``. Without httptools (it comes with ``uvicorn[standard]``)
    uvicorn's default (``"auto"``), with a warning: there is no deadline then."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        log.warning("httptools is not installed: no deadline on request headers (slowloris)")
        return "auto"

    class HeaderDeadlineProtocol(HttpToolsProtocol):
        _deadline: asyncio.TimerHandle | None = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._arm()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            if self._deadline is None:  # a later request on a kept-alive connection
                self._arm()

        def on_headers_complete(self) -> None:
            self._disarm()
            super().on_headers_complete()

        def handle_websocket_upgrade(self) -> None:
            transport = self.transport
            super().handle_websocket_upgrade()
            reason = answer_refused_upgrade(transport)
            if reason is not None:
                log.debug("refused a WebSocket upgrade from %s: %s", self.client, reason)

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            super().connection_lost(exc)

        def _arm(self) -> None:
            self._deadline = self.loop.call_later(timeout_s, self._expired)

        def _disarm(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _expired(self) -> None:
            self._deadline = None
            if not self.transport.is_closing():
                log.debug("closing %s: request headers not complete within %.1f s", self.client, timeout_s)
                HANDSHAKES_REFUSED.labels("headers_timeout").inc()
                # abort, not close: nothing useful is queued for a client this slow, and a close
                # would wait for it to read.
                self.transport.abort()

    return HeaderDeadlineProtocol
