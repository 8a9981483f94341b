"""What OpenAI clients expect around ``POST /v1/audio/speech``: ``GET /v1/models``,
``GET /v1/audio/voices``, OpenAI's voice names, Kokoro-style voice mixing, and OpenAI's JSON
error shape for everything under ``/v1`` (unknown paths, wrong methods, unexpected failures).

The official SDK parses every non-2xx body as ``{"error": {...}}`` and retries 5xx and 429 after
``Retry-After``: a plain-text 404/405/500 gives its caller an opaque ``APIStatusError``, and a
500 is retried three times for nothing.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Match, Route

from app.api.voices_api import api_error, json_errors, served
from app.ingress.voice_search import resolve_scene
from voxroom.errors import UnknownVoice
from voxroom.voices import mix as voice_mix
from voxroom.voices.catalog import Voice

if TYPE_CHECKING:
    from app.state import GatewayState

log = logging.getLogger("voxroom.gateway.openai")

MODELS: Final = ("tts-1", "tts-1-hd", "gpt-4o-mini-tts")
"""Model names ``/v1/audio/speech`` accepts (and ignores: the voice decides the engine)."""

OPENAI_VOICES: Final[dict[str, dict[str, str]]] = {
    "alloy": {"gender": "neutral"},
    "ash": {"gender": "male"},
    "ballad": {"gender": "male", "style": "storyteller"},
    "coral": {"gender": "female", "emotion": "happy"},
    "echo": {"gender": "male"},
    "fable": {"style": "storyteller"},
    "nova": {"gender": "female", "age": "young"},
    "onyx": {"gender": "male", "age": "elderly"},
    "sage": {"gender": "female", "emotion": "calm"},
    "shimmer": {"gender": "female"},
    "verse": {"gender": "male", "style": "narrator"},
    "marin": {"gender": "female"},
    "cedar": {"gender": "male", "emotion": "calm"},
}
"""OpenAI's voice names, each answered by the nearest served English catalog voice for its scene."""

_EVERY_METHOD: Final = ("GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS")
"""The catch-all's methods: a function endpoint with none given would take GET alone."""
def mixed_voice(state: GatewayState, name: str) -> Voice:
    """A Kokoro-style mix (``a+b``, ``a(2)+b(1)``) as the catalog's mix voice (voxroom/voices/mix.py):
    each part a catalog id or one of OpenAI's names, mapped as :func:`openai_voice` maps them.
    Raises :class:`~voxroom.voices.mix.BadMix` (malformed, a part unknown, or no blending engine)."""
    parts = []
    for part, weight in voice_mix.parse_kokoro(name):
        try:
            parts.append((openai_voice(state, part).id, weight))
        except UnknownVoice:
            raise voice_mix.BadMix(name, f"unknown voice {part!r}; see GET /v1/audio/voices",
                                   "unknown_voice") from None
    voice = state.catalog.get(voice_mix.canonical(parts))
    if not served(state, voice):
        raise voice_mix.BadMix(name, "no worker serves its voices now")
    return voice


def openai_voice(state: GatewayState, name: str) -> Voice:
    """A catalog id (served), or one of OpenAI's names mapped. Raises :class:`UnknownVoice`."""
    def is_served(v: Voice) -> bool:
        return served(state, v)

    if name in state.catalog:
        found = state.catalog.get(name)
        if is_served(found):
            return found
        raise UnknownVoice(name)
    scene = OPENAI_VOICES.get(name.lower())
    if scene is None:
        raise UnknownVoice(name)
    return resolve_scene(state.catalog, {"language": "eng", **scene}, is_served)


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [_model(m) for m in MODELS]})


async def get_model(request: Request) -> Response:
    name = request.path_params["model"]
    if name not in MODELS:
        return api_error(404, f"the model {name[:64]!r} does not exist; see GET /v1/models", "model_not_found",
                         param="model")
    return JSONResponse(_model(name))


def _model(name: str) -> dict[str, object]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "voxroom"}


async def list_audio_voices(request: Request) -> Response:
    """Kokoro-FastAPI's shape (``{"voices": [...]}``: every name ``voice`` takes) plus ``mapped``:
    which served catalog voice each OpenAI name stands for here."""
    state: GatewayState = request.app.state.voxroom
    mapped: dict[str, str] = {}
    for name in OPENAI_VOICES:
        try:
            mapped[name] = openai_voice(state, name).id
        except UnknownVoice:
            continue  # no served English voice: the name is refused, so it is not listed
    ids = [v.id for v in state.catalog if served(state, v)]
    return JSONResponse({"voices": [*mapped, *ids], "mapped": mapped})


async def _no_route(request: Request) -> Response:
    """Anything under ``/v1`` that no route serves: 405 (with ``Allow``) when the path exists for
    other methods, else 404, both in OpenAI's shape."""
    allowed: set[str] = set()
    for route in request.app.router.routes:
        if isinstance(route, Route) and route.endpoint is not _no_route:
            match, _ = route.matches(request.scope)
            if match == Match.PARTIAL and route.methods:
                allowed |= route.methods
    if allowed:
        return api_error(405, f"{request.method} is not allowed on {request.url.path}", "method_not_allowed",
                         headers={"Allow": ", ".join(sorted(allowed))})
    return api_error(404, f"no such endpoint: {request.method} {request.url.path}", "not_found")


def routes() -> list[BaseRoute]:
    """The routes, the ``/v1`` catch-all last: it must come after every other ``/v1`` route."""
    return [Route("/v1/models", json_errors(list_models), methods=["GET"]),
            Route("/v1/models/{model}", json_errors(get_model), methods=["GET"]),
            Route("/v1/audio/voices", json_errors(list_audio_voices), methods=["GET"]),
            Route("/v1/{rest:path}", _no_route, methods=_EVERY_METHOD)]
