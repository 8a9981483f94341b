"""A deadline on request headers (slowloris): uvicorn's HTTP protocol, with a timer.

uvicorn times out idle keep-alive connections, but not a request whose headers never finish: 1,500
half-open WebSocket upgrades, each sending a byte now and then, all stayed open (3,533 fds). Here
a timer starts when the connection opens (and when a later request on it begins) and is cancelled
when the request's headers are complete; when it fires first, the connection is closed. A
WebSocket upgrade is an HTTP request until its headers are complete, so it is covered too; what
follows the headers (a body, the WebSocket itself) has limits of its own.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger("voxroom.gateway.handshake")


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
                # abort, not close: nothing useful is queued for a client this slow, and a close
                # would wait for it to read.
                self.transport.abort()

    return HeaderDeadlineProtocol
