"""``GET /v1/voices`` (with filters) and ``POST /v1/voices/search`` (scene tags -> top-k voices).

Only voices that some live worker speaks are listed or found (before any worker was ever seen,
every catalog voice counts, as for ``say``). Errors follow OpenAI's shape, so that one client
library handles both this and ``/v1/audio/speech``: ``{"error": {"message", "type", "param", "code"}}``.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.api.body import CLOSE, BodyRefused, read_capped
from app.ingress.voice_search import SYNONYMS, index_for
from voxroom.voices import mix as voice_mix
from voxroom.voices.catalog import Voice
from voxroom.voices.languages import UnknownLanguage, normalize_language
from voxroom.wire.protocol import ProtocolError, check_encodable, parse_scene

if TYPE_CHECKING:
    from app.state import GatewayState

log = logging.getLogger("voxroom.gateway.api")

MAX_K = 50
MAX_BODY_BYTES = 8 * 1024


RETRY_AFTER_S = 1
"""What a 429/503 says in ``Retry-After`` when its caller gave no better figure: the OpenAI SDK
waits that long before its retry instead of its own short backoff."""


def api_error(status: int, message: str, code: str, *, kind: str | None = None, param: str | None = None,
              headers: dict[str, str] | None = None) -> JSONResponse:
    """An error in OpenAI's shape, ``{"error": {"message", "type", "param", "code"}}``, the one
    shape of every ``/v1`` error. ``kind`` defaults by status (``server_error`` from 500); a 429 or
    503 always carries ``Retry-After``."""
    headers = dict(headers or {})
    if status in (429, 503):
        headers.setdefault("Retry-After", str(RETRY_AFTER_S))
    if kind is None:
        kind = "server_error" if status >= 500 else "rate_limit_error" if status == 429 else "invalid_request_error"
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                        status_code=status, headers=headers)


def json_errors(handler: Callable[[Request], Awaitable[Response]]) -> Callable[[Request], Awaitable[Response]]:
    """``handler`` whose unexpected exceptions answer a JSON 500 (logged once here) instead of
    Starlette's plain-text one."""
    @functools.wraps(handler)
    async def wrapped(request: Request) -> Response:
        try:
            return await handler(request)
        except Exception:  # the one place a /v1 handler's failure ends
            log.exception("%s %s failed", request.method, request.url.path)
            return api_error(500, "internal error; the server logged it", "internal_error")
    return wrapped


def served(state: GatewayState, voice: Voice) -> bool:
    """Some live worker speaks ``voice``: one whose heartbeat lists it in ``voices``, or, for a
    worker that lists no voices (an older one, during a rolling upgrade), one that runs its engine.
    Before any worker was ever seen every voice counts (workers may still be loading)."""
    directory = state.directory
    if not directory.seen_any:
        return True
    wanted = voice_mix.part_ids(voice.id)  # a mix is served where all of its voices are
    for beat in directory.workers.values():
        listed = beat.get("voices")
        if listed is None:
            if voice.engine in beat.get("engines", "").split(","):
                return True
        elif wanted and set(wanted) <= set(listed.split(",")):
            return True
    return False


async def list_voices(request: Request) -> Response:
    """Every served voice; query parameters filter: ``language`` (any spelling languages.py knows:
    ``?language=cantonese`` finds ``yue``) and any tag (``?gender=female&age=elderly``)."""
    state: GatewayState = request.app.state.voxroom
    wanted = dict(request.query_params)
    # Starlette decodes %-escapes with errors="replace", so a surrogate cannot arrive today; the
    # check keeps that true whatever decodes the query string tomorrow.
    try:
        check_encodable(wanted)
    except ProtocolError as exc:
        return api_error(400, exc.message, exc.code)
    lang = wanted.pop("language", None)
    code = None
    if lang:
        try:
            parsed = normalize_language(lang)
        except UnknownLanguage as exc:
            return api_error(400, str(exc), "unknown_language")
        code = parsed.code
        if parsed.dialect and "dialect" not in wanted:
            wanted["dialect"] = parsed.dialect
    tags = {k.lower(): SYNONYMS.get(k.lower(), {}).get(v.lower(), v.lower()) for k, v in wanted.items()}
    voices = []
    for voice in state.catalog:
        if not served(state, voice) or (code is not None and voice.language != code):
            continue
        if all(voice.tags.get(name, "").lower() == value for name, value in tags.items()):
            voices.append(voice.public())
    return JSONResponse({"default": state.catalog.default, "voices": voices})


async def search_voices(request: Request) -> Response:
    """Body ``{"scene": {"emotion": "angry", "language": "yue"}, "k": 3}``; answer
    ``{"results": [{id, engine, language, name, tags, score}, ...]}``, best first."""
    state: GatewayState = request.app.state.voxroom
    body = await read_json(request)
    if isinstance(body, Response):
        return body
    try:
        scene = parse_scene(body.get("scene"))
    except ProtocolError as exc:
        return api_error(400, exc.message, exc.code)
    if scene is None:
        return api_error(400, "'scene' is required: an object of tags", "bad_message")
    k = body.get("k", 5)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_K:
        return api_error(400, f"'k' must be an integer from 1 to {MAX_K}", "bad_message")
    found = index_for(state.catalog).search(scene, k, lambda v: served(state, v))
    return JSONResponse({"scene": scene, "results": [m.public() for m in found]})


async def read_json(request: Request, max_bytes: int = MAX_BODY_BYTES) -> dict[str, Any] | Response:
    """The request's JSON object, or the 400/413 response to send instead. The body is read with a
    cap (app/api/body.py), and every string in it must be encodable (no lone surrogate), so that
    handlers, Redis and the JSON answer never meet one."""
    try:
        raw = await read_capped(request, max_bytes)
    except BodyRefused as exc:
        return api_error(exc.status, exc.message, exc.code, headers=CLOSE)
    try:
        body = json.loads(raw or b"null")
    except (ValueError, RecursionError):
        return api_error(400, "body is not JSON", "bad_json")
    if not isinstance(body, dict):
        return api_error(400, "body must be a JSON object", "bad_json")
    try:
        check_encodable(body)
    except ProtocolError as exc:
        return api_error(400, exc.message, exc.code)
    return body


def routes() -> list[Route]:
    return [Route("/v1/voices", json_errors(list_voices), methods=["GET"]),
            Route("/v1/voices/search", json_errors(search_voices), methods=["POST"])]
