"""Request bodies read with a cap: refused by ``Content-Length`` before a byte is read, or cut off at
the cap while streaming (chunked bodies, or a ``Content-Length`` that lies).

``Request.body()`` buffers whatever arrives before anyone can look at its size: a 200 MB body to an
anonymous endpoint once cost the gateway 345 MB before its 413. Here at most ``limit`` bytes (plus
the one chunk that crossed it) are ever held, and the refusal asks uvicorn to close the connection
(``Connection: close``), so the rest of a huge body is never read at all.
"""

from __future__ import annotations

from typing import Final

from starlette.requests import ClientDisconnect, Request

CLOSE: Final = {"Connection": "close"}
"""Headers for a refusal sent before the body was read: the connection cannot be reused."""


class BodyRefused(Exception):
    """The body is not read. ``status`` is 413 (too large) or 400 (bad ``Content-Length``)."""

    def __init__(self, status: int, message: str, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code


async def read_capped(request: Request, limit: int) -> bytes:
    """The whole body, when it is at most ``limit`` bytes. Raises :class:`BodyRefused` as soon as it
    is known to be larger (by ``Content-Length``, or by the bytes streamed so far), and when the
    client went away mid-body (status 400: nobody will read the answer)."""
    declared = request.headers.get("content-length")
    if declared is not None:
        try:
            size = int(declared)
        except ValueError:
            raise BodyRefused(400, "Content-Length is not a number", "bad_request") from None
        if size > limit:
            raise BodyRefused(413, f"body over {limit} bytes", "too_large")
    parts: list[bytes] = []
    received = 0
    try:
        async for chunk in request.stream():
            received += len(chunk)
            if received > limit:
                raise BodyRefused(413, f"body over {limit} bytes", "too_large")
            parts.append(chunk)
    except ClientDisconnect:
        raise BodyRefused(400, "client disconnected mid-body", "bad_request") from None
    return b"".join(parts)
