"""Who may open a room socket: room id, capacity, origin, token, codec, client id.

Everything here happens before the first message, and every refusal is a close with a clear
reason (1008 policy, 1013 full, 1012 restarting), so that clients can tell a typo from an
attack from a busy server.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from starlette.requests import HTTPConnection
from starlette.websockets import WebSocket

from app.room.identity import SECRET, generated_id
from voxroom.store.backoff import REDIS_DOWN
from voxroom.wire import protocol, tokens
from voxroom.wire.protocol import CloseCode
from voxroom.wire.tokens import Grant, TokenError

if TYPE_CHECKING:
    from app.state import GatewayState

log = logging.getLogger("voxroom.gateway.admission")

OPEN_GRANT_ROLE: tokens.Role = "host"
"""Under ``--insecure-dev`` every client may speak and cancel any line of its room (issue 30)."""


@dataclass(frozen=True, slots=True)
class Admitted:
    room: str
    client_id: str
    grant: Grant
    codec: int
    self_chosen: bool = False
    """The client named itself (``?client=``): its id must be claimed (app/room/identity.py)."""
    claim_secret: str | None = None
    """``?claim=``: the secret of this id's claim from an earlier connection (reclaims it at once)."""
    address: str | None = None
    """The client address its socket counts against (app/room/address_slots.py); ``None``: not counted."""


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
    address = ban_address(websocket)
    if address is not None:
        banned_s = state.flood_bans.remaining(address, time.monotonic())
        if banned_s:
            return Refused(CloseCode.POLICY_VIOLATION, f"flood: reconnect in {math.ceil(banned_s)} s")
    if state.connections >= settings.max_connections:
        return Refused(CloseCode.TRY_AGAIN_LATER, "gateway full; retry later")
    if address is not None and state.address_slots.full(address, settings.max_connections_per_address):
        return Refused(CloseCode.TRY_AGAIN_LATER, "too many connections from your address; retry later")
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
    # or poison the dedupe of, a sender whose identity a token vouches for. Generated ids live in
    # ``g-``, which neither may choose (app/room/identity.py).
    chosen = websocket.query_params.get("client")
    self_chosen = False
    if grant.subject:
        client_id = grant.subject
    elif not chosen:
        client_id = generated_id()
    elif (not protocol.valid_room_id(chosen) or len(chosen) > 62
          or chosen.startswith(tokens.GENERATED_PREFIX)):
        return Refused(CloseCode.POLICY_VIOLATION, "bad client id")
    else:
        client_id = chosen if settings.insecure_dev else tokens.SELF_CHOSEN_PREFIX + chosen
        self_chosen = True
    if not protocol.valid_room_id(client_id):
        return Refused(CloseCode.POLICY_VIOLATION, "bad client id")
    secret = websocket.query_params.get("claim") or None
    if secret is not None and (not self_chosen or not SECRET.fullmatch(secret)):
        return Refused(CloseCode.POLICY_VIOLATION, "bad claim: only with ?client=, as the welcome gave it")
    return Admitted(room=room, client_id=client_id, grant=grant, codec=codec, self_chosen=self_chosen,
                    claim_secret=secret, address=address)


async def claim_identity(state: GatewayState, decision: Admitted) -> str | Refused | None:
    """Claim a self-chosen client id for the connection's life (app/room/identity.py): the owner token
    to release it with, ``None`` when there is nothing to claim, or the refusal (1013: another
    live connection speaks as it, or Redis cannot say)."""
    if not decision.self_chosen or state.claims is None:
        return None
    try:
        owner = await state.claims.claim(decision.room, decision.client_id, secret=decision.claim_secret)
    except REDIS_DOWN:
        return Refused(CloseCode.TRY_AGAIN_LATER, "storage unavailable; retry later")
    if owner is None:
        return Refused(CloseCode.TRY_AGAIN_LATER, "client id in use; retry later")
    return owner


async def release_identity(state: GatewayState, decision: Admitted, owner: str | Refused | None) -> None:
    """Give back what :func:`claim_identity` took, if it took anything (never raises)."""
    if isinstance(owner, str) and state.claims is not None:
        await state.claims.release(decision.room, decision.client_id, owner)


def ban_address(websocket: HTTPConnection) -> str | None:
    """The client address a flood ban applies to, or ``None`` when there is none to trust.

    Behind a proxy uvicorn trusts (``FORWARDED_ALLOW_IPS``, loopback by default) the scope's client
    is the one ``X-Forwarded-For`` names. Behind one it does not trust, the scope's client is the
    proxy itself, shared by every client behind it: banning it would shut all of them out for one
    flooder, so there is no ban then (the flood close itself still happens). The speech API's
    per-client share counts HTTP requests by the same address (app/api/speech_api.py)."""
    if websocket.client is None:
        return None
    host = websocket.client.host
    forwarded = websocket.headers.get("x-forwarded-for")
    if forwarded is not None and host not in {hop.strip() for hop in forwarded.split(",")}:
        return None
    return host


def record_flood(websocket: WebSocket, state: GatewayState) -> None:
    """The connection was closed for flooding: refuse its address for ``settings.flood_ban_s``."""
    address = ban_address(websocket)
    if address is None:
        log.warning("flood from behind an untrusted proxy (%s): no reconnect ban; set FORWARDED_ALLOW_IPS "
                    "to the proxy's address", websocket.client.host if websocket.client else "?")
        return
    if state.settings.flood_ban_s > 0:
        state.flood_bans.ban(address, time.monotonic() + state.settings.flood_ban_s)
