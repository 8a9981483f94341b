"""Who may open a room socket: room id, capacity, origin, token, codec, client id.

Everything here happens before the first message, and every refusal is a close with a clear
reason (1008 policy, 1013 full, 1012 restarting), so that clients can tell a typo from an
attack from a busy server.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from starlette.websockets import WebSocket

from app.state import GatewayState
from voxroom import protocol, tokens
from voxroom.protocol import CloseCode
from voxroom.tokens import Grant, TokenError

OPEN_GRANT_ROLE: tokens.Role = "speaker"


@dataclass(frozen=True, slots=True)
class Admitted:
    room: str
    client_id: str
    grant: Grant
    codec: int


@dataclass(frozen=True, slots=True)
class Refused:
    code: int
    reason: str


def admit(websocket: WebSocket, state: GatewayState) -> Admitted | Refused:
    settings = state.settings
    room = websocket.path_params["room_id"]
    if not protocol.valid_room_id(room):
        return Refused(CloseCode.POLICY_VIOLATION, "bad room id: 1-64 of A-Z a-z 0-9 _ -")
    if state.draining:
        return Refused(CloseCode.SERVICE_RESTART, "restarting")
    if state.connections >= settings.max_connections:
        return Refused(CloseCode.TRY_AGAIN_LATER, "gateway full; retry later")
    origin = websocket.headers.get("origin")
    if settings.allowed_origins and origin is not None and origin not in settings.allowed_origins:
        return Refused(CloseCode.POLICY_VIOLATION, "origin not allowed")
    if settings.insecure_dev:
        grant = Grant(room=room, role=OPEN_GRANT_ROLE, subject=None)
    else:
        try:
            grant = tokens.verify(settings.jwt_secret or "", websocket.query_params.get("token"), room)
        except TokenError as exc:
            return Refused(CloseCode.POLICY_VIOLATION, str(exc))
    codec = protocol.CODECS_BY_NAME.get(websocket.query_params.get("codec") or "pcm16")
    if codec is None:
        return Refused(CloseCode.POLICY_VIOLATION, "codec must be pcm16 or opus")
    # A token's subject is the sender identity (dedupe survives reconnects and cannot be forged).
    # Without one the client may name itself for the same purpose; with auth on, such self-chosen
    # names live in their own ``c-`` namespace (tokens may not carry it), so nobody can speak as,
    # or poison the dedupe of, a sender whose identity a token vouches for.
    chosen = websocket.query_params.get("client") or uuid.uuid4().hex[:12]
    if grant.subject:
        client_id = grant.subject
    elif not protocol.valid_room_id(chosen) or len(chosen) > 62:
        return Refused(CloseCode.POLICY_VIOLATION, "bad client id")
    else:
        client_id = chosen if settings.insecure_dev else tokens.SELF_CHOSEN_PREFIX + chosen
    if not protocol.valid_room_id(client_id):
        return Refused(CloseCode.POLICY_VIOLATION, "bad client id")
    return Admitted(room=room, client_id=client_id, grant=grant, codec=codec)
