"""A ``say`` checked against the voices this deployment serves, stored, and answered.

The room socket (app/room/ws.py) has already parsed the frame (voxroom/wire/protocol.py),
checked that the connection may speak and its rate; here the line meets the catalog and the
worker directory, then the store's ingress (voxroom/store/interface.py ``Ingress``), and every
outcome becomes the client's answer: ``accepted``, or an ``error`` it can act on (``duplicate``,
``busy`` with ``retry_after_ms``, ``unavailable``, ``unknown_voice``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from app.ingress.voice_search import resolve_scene
from voxroom.errors import NotReplicated, UnknownVoice
from voxroom.runtime import metrics
from voxroom.store.backoff import REDIS_DOWN
from voxroom.wire import protocol
from voxroom.wire.protocol import ErrorCode, ProtocolError

if TYPE_CHECKING:
    from app.fanout.connection import ClientConnection
    from app.state import GatewayState

log = logging.getLogger("voxroom.gateway.ws")


async def store_line(msg: protocol.Say, conn: ClientConnection, state: GatewayState) -> None:
    """Store ``msg`` and answer it on ``conn``. Raises :class:`ProtocolError` for every refusal
    (the caller turns it into the ``error`` message)."""
    try:
        voice = (resolve_scene(state.catalog, msg.scene, lambda v: state.directory.serves(v.id))
                 if msg.scene is not None else state.catalog.get(msg.voice))
    except UnknownVoice as exc:
        raise ProtocolError(ErrorCode.UNKNOWN_VOICE, str(exc), seq=msg.seq) from None
    if not state.directory.serves(voice.id):
        raise ProtocolError(ErrorCode.UNKNOWN_VOICE,
                            f"voice {voice.id!r} needs engine {voice.engine!r}, which no worker runs", seq=msg.seq)
    try:
        outcome = await state.ingress.say(conn.room, conn.client_id, msg.seq, msg.text, voice.id,
                                           lexicon=msg.lexicon, to=msg.to or (), open_line=msg.open)
    except NotReplicated as exc:
        # The line is in the primary (it will be spoken) but WAIT did not confirm the replicas:
        # not "accepted", as a failover now could lose it. Before REDIS_DOWN, which it is also
        # part of, so the log does not say "not stored". The client resends the same seq; the
        # dedupe answers it duplicate once the replicas confirm.
        log.warning("say in room %s stored in the primary, not confirmed by the replicas: %s", conn.room, exc)
        raise ProtocolError(ErrorCode.UNAVAILABLE, "storage unavailable; resend later", seq=msg.seq,
                            retry_after_ms=1000) from None
    except REDIS_DOWN as exc:
        # Redis is restarting, loading, out of memory or unreachable: nothing was written, the
        # client may resend the same seq (dedupe makes that safe) once it is back.
        log.warning("say in room %s not stored, redis unavailable: %s", conn.room, exc)
        raise ProtocolError(ErrorCode.UNAVAILABLE, "storage unavailable; resend later", seq=msg.seq,
                            retry_after_ms=1000) from None
    if outcome.status == "accepted":
        metrics.FIRST_AUDIO.accepted(conn.room, outcome.utterance)
        conn.send_text(protocol.encode_server_message(
            {"type": "accepted", "seq": msg.seq, "utterance": outcome.utterance}))
    elif outcome.status == "duplicate":
        raise ProtocolError(ErrorCode.DUPLICATE,
                            f"seq {msg.seq} already stored (last {outcome.utterance}); ignored", seq=msg.seq)
    elif outcome.status == "too_old":
        raise ProtocolError(ErrorCode.SEQ_TOO_OLD,
                            f"seq {msg.seq} is too far below your last stored line ({outcome.utterance}) to tell "
                            "whether it was stored; not stored now: send it again with a new seq", seq=msg.seq)
    else:
        backlog = outcome.utterance
        raise ProtocolError(ErrorCode.BUSY, f"room has {backlog} utterances waiting; retry later",
                            seq=msg.seq, retry_after_ms=500 + 250 * backlog)
