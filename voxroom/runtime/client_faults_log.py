"""A client's bad bytes are the client's fault: one warning line, not a server error with a traceback.

RFC 6455 (section 8.1) makes a server fail a WebSocket whose text frame is not valid UTF-8, and
uvicorn's ``websockets-sansio`` protocol does: it closes with 1007 and tells the app the socket is
gone, so nothing leaks. But it logs that at ERROR with the ``UnicodeDecodeError``'s traceback (six
lines), once per such frame: anyone who can open a socket can fill the gateway's error log at will,
and an operator paged on ERROR lines is paged for someone else's bug. This filter rewrites exactly
that record into one WARNING line that says what happened and what the client got.
"""

from __future__ import annotations

import logging

INVALID_UTF8 = "Invalid UTF-8 sequence received from client."
"""The message uvicorn's ``websockets_sansio_impl`` logs (with ``logger.exception``) for a text frame
that is not UTF-8 (uvicorn 0.30 and later)."""

REWRITTEN = "a client sent a text frame that is not valid UTF-8: closed with 1007 (RFC 6455, 8.1)"


class ClientFaultsAsWarnings(logging.Filter):
    """Turns uvicorn's invalid-UTF-8 record into :data:`REWRITTEN` at WARNING, without the traceback.
    Every other record passes unchanged. Always lets the record through: the event stays visible."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == INVALID_UTF8 and isinstance(record.exc_info, tuple) \
                and isinstance(record.exc_info[1], UnicodeDecodeError):
            record.msg, record.args = REWRITTEN, ()
            record.levelno, record.levelname = logging.WARNING, logging.getLevelName(logging.WARNING)
            record.exc_info, record.exc_text = None, None
        return True


def install() -> None:
    """Attach the filter to ``uvicorn.error`` (where uvicorn's protocols log), after uvicorn's own
    logging configuration."""
    logging.getLogger("uvicorn.error").addFilter(ClientFaultsAsWarnings())
