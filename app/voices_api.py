"""``GET /v1/voices`` (with filters) and ``POST /v1/voices/search`` (scene tags -> top-k voices).

Only voices that some live worker speaks are listed or found (before any worker was ever seen,
every catalog voice counts, as for ``say``). Errors follow OpenAI's shape, so that one client
library handles both this and ``/v1/audio/speech``: ``{"error": {"message", "type", "code"}}``.
"""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.body import CLOSE, BodyRefused, read_capped
from app.state import GatewayState
from voxroom.languages import UnknownLanguage, normalize_language
from voxroom.protocol import ProtocolError, check_encodable, parse_scene
from voxroom.voice_search import SYNONYMS, index_for
from voxroom.voices import Voice

MAX_K = 50
MAX_BODY_BYTES = 8 * 1024


def api_error(status: int, message: str, code: str, *, kind: str = "invalid_request_error",
              headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=status,
                        headers=headers)


def served(state: GatewayState, voice: Voice) -> bool:
    """Some live worker speaks ``voice``: one whose heartbeat lists it in ``voices``, or, for a
    worker that lists no voices (an older one, during a rolling upgrade), one that runs its engine.
    Before any worker was ever seen every voice counts (workers may still be loading)."""
    directory = state.directory
    if not directory.seen_any:
        return True
    for beat in directory.workers.values():
        listed = beat.get("voices")
        if voice.id in listed.split(",") if listed is not None else voice.engine in beat.get("engines", "").split(","):
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


async def read_json(request: Request) -> dict[str, Any] | Response:
    """The request's JSON object, or the 400/413 response to send instead. The body is read with a
    cap (app/body.py), and every string in it must be encodable (no lone surrogate), so that
    handlers, Redis and the JSON answer never meet one."""
    try:
        raw = await read_capped(request, MAX_BODY_BYTES)
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
    return [Route("/v1/voices", list_voices, methods=["GET"]),
            Route("/v1/voices/search", search_voices, methods=["POST"])]
