"""The game master's ``cancel`` over HTTP (issue 30), for a server-side game loop that holds no
room socket:

- ``DELETE /v1/rooms/{room}/utterances/{n}``: stop line ``n`` of the room;
- ``DELETE /v1/rooms/{room}/utterances``: clear the room (every line not yet finished that the
  caller may cancel).

``Authorization: Bearer <room token>`` (unless ``--insecure-dev``, where every caller is a host,
as on the room socket): a ``host`` token may cancel any line of the room, a ``speaker`` token the
lines its subject said (the subject is the client id its room socket speaks as), a ``listener``
none. The cancel goes through the same store call as the socket's (app/ingress/cancel.py), so the
room hears exactly what a socket's cancel makes it hear. Answers ``200 {"cancelled": [...]}``;
errors in the one ``/v1`` shape (app/api/voices_api.py ``api_error``): 401 (token), 403
``forbidden``, 404 ``not_found`` (no such line, finished, or already cancelled; a private speech
room), 400 (room id, number), 503 ``unavailable`` with ``Retry-After``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from app.api.voices_api import api_error, json_errors
from voxroom.errors import CancelRefused
from voxroom.store import keys
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.interface import CancelRequest
from voxroom.wire import tokens
from voxroom.wire.protocol import MAX_SEQ, ErrorCode, valid_room_id

if TYPE_CHECKING:
    from app.state import GatewayState

log = logging.getLogger("voxroom.gateway.api")

_STATUS = {ErrorCode.FORBIDDEN: 403, ErrorCode.NOT_FOUND: 404}


def _caller(request: Request, state: GatewayState, room: str) -> tuple[str, bool] | Response:
    """(client id, host) of the caller, or the 401/403 to answer."""
    if state.settings.insecure_dev:
        return "", True
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    try:
        if scheme.lower() != "bearer":
            raise tokens.TokenError("token required: Authorization: Bearer <room token>")
        grant = tokens.verify(state.settings.jwt_secret or "", token.strip(), room)
    except tokens.TokenError as exc:
        return api_error(401, str(exc), "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    if not grant.can_speak:
        return api_error(403, "a listener token cannot cancel lines", "forbidden")
    # A speaker token without a subject owns no line another connection could name.
    return grant.subject or "", grant.can_cancel_any


async def _cancel(request: Request, number: int | None) -> Response:
    state: GatewayState = request.app.state.voxroom
    room = request.path_params["room"]
    if not valid_room_id(room):
        return api_error(400, "not a room id: 1 to 64 of A-Z a-z 0-9 _ -", "bad_room", param="room")
    if room.startswith(keys.PRIVATE_ROOM_PREFIX):
        return api_error(404, "no such room", "not_found", param="room")
    caller = _caller(request, state, room)
    if isinstance(caller, Response):
        return caller
    client_id, host = caller
    what = CancelRequest("all", None, client_id, host) if number is None else \
        CancelRequest("utterance", number, client_id, host)
    try:
        cancelled = await state.ingress.cancel(room, what)
    except CancelRefused as exc:
        return api_error(_STATUS.get(exc.code, 400), str(exc), exc.code)
    except REDIS_DOWN as exc:
        log.warning("cancel in room %s over HTTP not stored, redis unavailable: %s", room, exc)
        return api_error(503, "storage unavailable; cancel again later", ErrorCode.UNAVAILABLE)
    log.info("HTTP cancel in room %s by %s: %s", room, client_id or "host", cancelled or "nothing")
    return JSONResponse({"cancelled": sorted(cancelled)})


async def cancel_one(request: Request) -> Response:
    raw = request.path_params["n"]
    number = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 16 else 0
    if not 1 <= number <= MAX_SEQ:
        return api_error(400, f"an utterance is a room number, 1 to {MAX_SEQ}", "bad_message", param="n")
    return await _cancel(request, number)


async def cancel_all(request: Request) -> Response:
    return await _cancel(request, None)


def routes() -> list[Route]:
    return [Route("/v1/rooms/{room}/utterances/{n}", json_errors(cancel_one), methods=["DELETE"]),
            Route("/v1/rooms/{room}/utterances", json_errors(cancel_all), methods=["DELETE"])]
