"""Signed room tokens (JWT, HS256, PyJWT): who may join which room, and whether they may speak.

Claims: ``room`` (one room id, or ``*`` for every room), ``role`` (``speaker``, ``listener``, or
``host``: a speaker that may also cancel other clients' lines),
``exp`` (required), and optionally ``sub`` (the client id: a sender's ``seq`` dedupe survives
reconnects). ``voxroom token`` mints one; the gateway verifies it from the ``token`` query
parameter (browsers cannot set headers on a WebSocket).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Literal

import jwt

from voxroom.errors import VoxroomError
from voxroom.wire.protocol import valid_room_id

Role = Literal["speaker", "listener", "host"]
ROLES: tuple[Role, ...] = ("speaker", "listener", "host")
ALGORITHM = "HS256"
MIN_SECRET_BYTES = 32  # HS256 with a shorter key is guessable; PyJWT warns below this too
SELF_CHOSEN_PREFIX = "c-"
"""Client ids a client picks itself (``?client=``) get this prefix when auth is on; token subjects
may not start with it, so a self-chosen id can never equal one a token vouches for."""
GENERATED_PREFIX = "g-"
"""Client ids the gateway generates (app/room/identity.py) start with this; neither token subjects nor
self-chosen ids may, so a generated id seen in ``start.sender`` cannot be spoken as."""
RESERVED_PREFIXES = (SELF_CHOSEN_PREFIX, GENERATED_PREFIX)


class TokenError(VoxroomError):
    """The token is missing, malformed, expired, tampered with, or for another room. The message
    is the close reason the client sees."""


@dataclass(frozen=True, slots=True)
class Grant:
    room: str
    role: Role
    subject: str | None

    @property
    def can_speak(self) -> bool:
        return self.role in ("speaker", "host")

    @property
    def can_cancel_any(self) -> bool:
        """May cancel any line of the room, not only its own (``cancel``)."""
        return self.role == "host"


def mint(secret: str, room: str, role: Role, *, ttl_s: int = 3600, subject: str | None = None,
         now: float | None = None) -> str:
    """A token for ``room`` (or ``*``). Raises ``ValueError`` for what no gateway would accept:
    a room or subject outside the ids the gateway takes (1 to 64 of ``A-Z a-z 0-9 _ -``), a
    secret shorter than :data:`MIN_SECRET_BYTES` (a gateway with it refuses to start). A token
    that is already expired (``ttl_s`` ≤ 0) is the caller's choice: tests need one."""
    if role not in ROLES:
        raise ValueError("role must be speaker, listener or host")
    if len(secret.encode()) < MIN_SECRET_BYTES:
        raise ValueError(f"the secret must be at least {MIN_SECRET_BYTES} bytes, as the gateway's "
                         "VOXROOM_JWT_SECRET (a gateway refuses to start with a shorter one)")
    if room != "*" and not valid_room_id(room):
        raise ValueError(f"not a room id: {room!r} (1 to 64 of A-Z a-z 0-9 _ -, or * for every room)")
    if subject is not None and not valid_room_id(subject):
        raise ValueError(f"not a client id: {subject!r} (1 to 64 of A-Z a-z 0-9 _ -): the gateway would "
                         "close the connection with 'bad client id'")
    if subject and subject.startswith(RESERVED_PREFIXES):
        raise ValueError(f"a token subject may not start with {' or '.join(map(repr, RESERVED_PREFIXES))} "
                         "(self-chosen and generated client ids)")
    issued = int(now if now is not None else time.time())
    claims: dict[str, object] = {"room": room, "role": role, "iat": issued, "exp": issued + ttl_s}
    if subject:
        claims["sub"] = subject
    return jwt.encode(claims, secret, algorithm=ALGORITHM)


def verify(secret: str, token: str | None, room: str) -> Grant:
    """The grant a token gives for ``room``. Raises :class:`TokenError` with a short reason."""
    if not token:
        raise TokenError("token required")
    try:
        claims = jwt.decode(token, secret, algorithms=[ALGORITHM], options={"require": ["exp", "room", "role"]})
    except jwt.ExpiredSignatureError:
        raise TokenError("token expired") from None
    except jwt.InvalidSignatureError:
        raise TokenError("bad token signature") from None
    except jwt.MissingRequiredClaimError as exc:
        raise TokenError(f"token lacks the {exc.claim!r} claim") from None
    except jwt.InvalidTokenError:
        raise TokenError("malformed token") from None
    if claims["room"] not in (room, "*"):
        raise TokenError("token is for another room")
    role = claims["role"]
    if role not in ROLES:
        raise TokenError("token role must be speaker, listener or host")
    sub = claims.get("sub")
    if isinstance(sub, str) and sub.startswith(RESERVED_PREFIXES):
        raise TokenError(f"token subject may not start with {' or '.join(map(repr, RESERVED_PREFIXES))}")
    return Grant(room=room, role=role, subject=sub if isinstance(sub, str) else None)
