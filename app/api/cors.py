"""CORS for what a page on another origin uses: the client modules and the ``/v1`` HTTP API.

The allow-list is ``settings.allowed_origins``, the same list the WebSocket's ``Origin`` check
uses (``app/room/admission.py``), so one setting decides which sites may use the gateway at all:

- **A list**: a listed origin gets ``Access-Control-Allow-Origin: <that origin>`` and its
  preflights are answered; any other origin gets no CORS header, its preflight answers 403, and
  its simple requests are served without CORS headers (the browser then hides the response).
- **Empty**: any origin, as the WebSocket lets any origin in. Answered with ``*`` and never with
  credentials: no cookie or HTTP auth is ever sent cross-origin; the speech API's bearer token is
  a header the page sets itself. Private Network Access preflights are refused in this mode: an
  unlisted public site must not reach a gateway on a private address through a visitor's browser.

Only :data:`CORS_PATHS` take part. Everything else (``/``, ``/healthz``, ``/readyz``,
``/metrics``) is for the operator and keeps same-origin rules; a preflight there falls through
to the routes and is refused by them (405).

Starlette's :class:`CORSMiddleware` builds the headers. It is not enough alone: it applies to
every path, answers a refused preflight with ``Access-Control-Allow-Methods`` and friends, adds
``Access-Control-Expose-Headers`` to responses for any origin, and reads ``*`` in the list as
"any origin" where the WebSocket check reads it literally. :class:`Cors` decides the origin and
the path first and hands only allowed requests to it.
"""

from __future__ import annotations

from collections.abc import Sequence

from starlette.datastructures import Headers, MutableHeaders
from starlette.middleware.cors import CORSMiddleware
from starlette.responses import PlainTextResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CORS_PATHS = ("/client", "/v1", "/dev/captioned_speech")
"""Path prefixes (whole segments) open to other origins: the ES modules and the AudioWorklet a
page imports, and the HTTP API (voices, models, speech, and its JSON errors), with the captioned
speech endpoint also at Kokoro-FastAPI's path."""

EXPOSE_HEADERS = ("Retry-After", "X-Voxroom-Voice")
"""Response headers a page's script may read besides the CORS-safelisted ones: when to retry a
503/429, and which catalog voice the speech API chose."""

METHODS = ("GET", "HEAD", "POST")

MAX_AGE_S = 3600
"""How long a browser may cache a preflight answer (Chromium caps it at 7200 s)."""


def covered(path: str) -> bool:
    """Whether ``path`` is one of :data:`CORS_PATHS` or below one (``/v1x`` is not ``/v1``)."""
    return any(path == prefix or path.startswith(prefix + "/") for prefix in CORS_PATHS)


class Cors:
    """ASGI middleware: CORS on :data:`CORS_PATHS` for ``allowed_origins`` (empty: any origin)."""

    def __init__(self, app: ASGIApp, *, allowed_origins: Sequence[str]) -> None:
        self.app = app
        self.any_origin = not allowed_origins
        self.allowed = frozenset(allowed_origins)
        # Exact origins are matched here, so "*" in the list means no more than it does to the
        # WebSocket check (an Origin header that is literally "*"): keep CORSMiddleware from
        # reading it as a wildcard.
        listed = sorted(origin for origin in self.allowed if origin != "*")
        self.headers = CORSMiddleware(
            app,
            allow_origins=("*",) if self.any_origin else listed,
            allow_methods=METHODS,
            # Mirrored: requests carry no credentials, and OpenAI's JS SDK sends headers of its own.
            allow_headers=("*",),
            allow_private_network=not self.any_origin,
            expose_headers=EXPOSE_HEADERS,
            max_age=MAX_AGE_S,
        )

    def allows(self, origin: str) -> bool:
        return self.any_origin or origin in self.allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not covered(scope["path"]):
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        if origin is None or self.allows(origin):
            await self.headers(scope, receive, send)
            return
        if scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            refused = PlainTextResponse("CORS: origin not allowed", status_code=403, headers={"Vary": "Origin"})
            await refused(scope, receive, send)
            return

        async def send_with_vary(message: Message) -> None:
            # The same URL answers an allowed origin with CORS headers: a cache must not hand
            # this answer to it, nor the other way round.
            if message["type"] == "http.response.start":
                MutableHeaders(scope=message).add_vary_header("Origin")
            await send(message)

        await self.app(scope, receive, send_with_vary)
