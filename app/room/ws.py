"""The room WebSocket: ``/rooms/{room_id}/ws``.

One coroutine per connection reads control frames; a writer task (see ``connection.py``) sends.
Every recoverable problem is answered with a typed ``error`` message and the connection stays
open; only binary garbage (1003), policy violations (1008) and shutdown (1012) close it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import TYPE_CHECKING

from starlette.websockets import WebSocket, WebSocketDisconnect

from app.fanout.connection import ClientConnection
from app.fanout.hub import ResumeRefused
from app.fanout.resume import ResumePoint, parse
from app.fanout.transport import limit_send_buffer
from app.ingress.cancel import cancel_lines
from app.ingress.lines import append_piece, flush_line
from app.ingress.say import store_line
from app.room.admission import Refused, admit, claim_identity, record_flood, release_identity
from app.room.identity import claim_secret
from app.room.ratelimit import TokenBucket
from voxroom.runtime import metrics
from voxroom.store.backoff import REDIS_DOWN
from voxroom.wire import protocol
from voxroom.wire.protocol import CloseCode, ErrorCode, ProtocolError
from voxroom.wire.tokens import Grant

if TYPE_CHECKING:
    from app.state import GatewayState

log = logging.getLogger("voxroom.gateway.ws")


async def room_endpoint(websocket: WebSocket) -> None:
    state: GatewayState = websocket.app.state.voxroom
    decision = admit(websocket, state)
    await websocket.accept()
    if isinstance(decision, Refused):
        metrics.CONNECTIONS_REFUSED.labels(str(decision.code)).inc()
        await _close(websocket, decision.code, decision.reason)
        return
    room, client_id = decision.room, decision.client_id
    limit_send_buffer(websocket, state.settings.send_buffer_bytes)
    conn = ClientConnection(websocket, room=room, client_id=client_id, limit=state.settings.send_queue_slices,
                            codec=decision.codec)
    state.connections += 1
    if decision.address is not None:
        state.address_slots.take(decision.address)
    state.clients.add(conn)
    writer = asyncio.create_task(conn.run_writer(), name=f"room:{room}:client:{client_id}:writer")
    claim: str | Refused | None = None
    try:
        # Inside the try: whatever happens once it is taken, the finally gives it back.
        claim = await claim_identity(state, decision)
        if isinstance(claim, Refused):
            metrics.CONNECTIONS_REFUSED.labels(str(claim.code)).inc()
            await _close(websocket, claim.code, claim.reason)
            return
        hello: protocol.Welcome = {
            "type": "welcome", "protocol": protocol.PROTOCOL_VERSION, "room": room, "client": client_id,
            "sample_rate": protocol.ROOM_RATE, "slice_ms": protocol.SLICE_MS, "voice": state.catalog.default,
            "server_ms": time.time() * 1000.0, "codec": protocol.CODEC_NAMES[decision.codec],
            "role": decision.grant.role, "lead_ms": state.settings.lead_ms}
        if isinstance(claim, str):  # reconnecting with ?claim= takes the id back at once (app/room/identity.py)
            hello["claim"] = claim_secret(claim)
        welcome = protocol.encode_server_message(hello)
        resume, bad_resume = _resume_point(websocket)
        try:
            await state.hub.join(conn, resume, welcome=welcome)
        except REDIS_DOWN as exc:
            log.warning("client %s could not join room %s, redis unavailable: %s", client_id, room, exc)
            await _close(websocket, CloseCode.TRY_AGAIN_LATER, "storage unavailable; reconnect later")
            return
        if bad_resume is not None:
            conn.send_text(protocol.encode_server_message(protocol.error_message(ErrorCode.BAD_MESSAGE, bad_resume)))
        await _receive_loop(websocket, conn, state, writer, decision.grant)
    finally:
        conn.close()
        # First: the name is free as soon as this connection can no longer speak (a client that
        # reconnects at once waits for it).
        await release_identity(state, decision, claim)
        try:
            await state.hub.leave(conn)
        except Exception:  # never out of here: the slot and the count below must be freed
            log.exception("client %s: leaving room %s failed", client_id, room)
        state.clients.discard(conn)
        state.connections -= 1
        if decision.address is not None:
            state.address_slots.give(decision.address)
        metrics.CLOSED_CLIENTS.client_closed(conn.sent_audio, conn.dropped_audio)
        await asyncio.wait([writer], timeout=1.0)
        if not writer.done():
            writer.cancel()
        # Retrieve how the writer ended (a send to a socket already gone raises), or asyncio logs
        # "Task exception was never retrieved".
        await asyncio.gather(writer, return_exceptions=True)


def _resume_point(websocket: WebSocket) -> tuple[ResumePoint | None, str | None]:
    """``?resume=`` (what a reconnecting client already holds, docs/protocol.md), or why it is
    malformed: such a client is told so (``bad_message``) and joins live, as without it."""
    value = websocket.query_params.get("resume")
    if value is None:
        return None, None
    try:
        return parse(value), None
    except ValueError as exc:
        return None, str(exc)


async def _close(websocket: WebSocket, code: int, reason: str) -> None:
    """Close with ``code``. A client that is already gone is no error: starlette raises
    WebSocketDisconnect then, and uvicorn a RuntimeError when it closed the connection itself
    meanwhile (a later frame past its 64 KiB limit, a keepalive timeout: seen in the fuzz run);
    either would reach uvicorn as a logged traceback, which a hostile client could repeat."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError):
        await websocket.close(code, reason)


class _Limits:
    """The connection's token buckets and its count of frames refused in a row."""

    __slots__ = ("flood_close_after", "frames", "refused_in_row", "resumes", "says")

    def __init__(self, state: GatewayState) -> None:
        now = time.monotonic()
        s = state.settings
        self.frames = TokenBucket(s.frame_rate, s.frame_burst, now)
        self.says = TokenBucket(s.say_rate, s.say_burst, now)
        self.resumes = TokenBucket(s.resume_rate, s.resume_burst, now)
        self.refused_in_row = 0
        self.flood_close_after = s.flood_close_after


async def _receive_loop(websocket: WebSocket, conn: ClientConnection, state: GatewayState,
                        writer: asyncio.Task[None], grant: Grant) -> None:
    limits = _Limits(state)
    while True:
        # A plain await, no task per message: idle sockets are most of a gateway's memory. When the
        # writer gives up (socket gone, or a hopeless client closed with 1013) this receive ends too.
        message = await websocket.receive()
        if message["type"] == "websocket.disconnect":
            return
        data = message.get("text")
        if data is None:
            data = message.get("bytes") or b""
        try:
            wait_s = limits.frames.take(time.monotonic())
            if wait_s:
                limits.refused_in_row += 1
                if limits.refused_in_row >= limits.flood_close_after:
                    log.warning("client %s in room %s flooded the gateway; closing", conn.client_id, conn.room)
                    record_flood(websocket, state)
                    await _drain(conn, writer)
                    await _close(websocket, CloseCode.POLICY_VIOLATION, "flood: too many frames")
                    # Return, not raise: an exception out of the endpoint makes uvicorn log a
                    # 40-line traceback per close, which a hostile client could repeat at will.
                    return
                raise ProtocolError(ErrorCode.RATE_LIMITED, "too many frames; this one was ignored",
                                    retry_after_ms=int(wait_s * 1000) + 1)
            limits.refused_in_row = 0
            parsed = protocol.parse_client_message(protocol.decode_client_frame(data))
            await _handle(parsed, conn, state, grant, limits)
        except ProtocolError as exc:
            metrics.ERRORS.labels(exc.code).inc()
            if exc.fatal:
                await _drain(conn, writer)
                await _close(websocket, CloseCode.UNSUPPORTED_DATA, exc.message[:120])
                return
            conn.send_text(protocol.encode_server_message(
                protocol.error_message(exc.code, exc.message, seq=exc.seq, retry_after_ms=exc.retry_after_ms)))
        except Exception:
            # One place where a frame's unexpected failure ends: logged, counted, answered with
            # ``internal``, and the connection (and the room) carry on. A bug in handling one frame
            # must not cost this client its socket and every listener a reconnect. (Cancellation
            # is a BaseException: shutdown still passes through.)
            log.exception("client %s in room %s: handling a frame failed", conn.client_id, conn.room)
            metrics.ERRORS.labels(ErrorCode.INTERNAL).inc()
            conn.send_text(protocol.encode_server_message(
                protocol.error_message(ErrorCode.INTERNAL, "internal error; this frame was not acted on")))
        # receive() does not suspend while frames are buffered: yield once per frame so that a
        # flooding client cannot monopolise the loop (its own writer and every other room run too).
        # After the frame, not before: a line is handled in the loop turn that received it, so
        # the says of a burst of rooms leave for Redis one loop turn sooner (docs/benchmarks.md).
        await asyncio.sleep(0)


async def _drain(conn: ClientConnection, writer: asyncio.Task[None], timeout_s: float = 1.0) -> None:
    """Stop queueing and let the writer send what is queued (answers to frames already read)
    before the close frame; a client too slow for that within ``timeout_s`` loses the rest."""
    conn.close()
    await asyncio.wait([writer], timeout=timeout_s)


async def _handle(msg: protocol.ClientMessage, conn: ClientConnection, state: GatewayState, grant: Grant,
                  limits: _Limits) -> None:
    if isinstance(msg, protocol.Ping):
        conn.send_text(protocol.encode_server_message(
            {"type": "pong", "t": msg.t, "server_ms": time.time() * 1000.0}))
        return
    if isinstance(msg, protocol.Resume):
        await _resume_message(msg, conn, state, limits)
        return
    if isinstance(msg, protocol.Cancel):
        if msg.room is not None and msg.room != conn.room:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "a socket cancels lines of its own room only")
        if not grant.can_speak:
            raise ProtocolError(ErrorCode.FORBIDDEN, "a listener token cannot cancel lines")
        # The same bucket as says: each cancel is a script call on the room's state.
        wait_s = limits.says.take(time.monotonic())
        if wait_s:
            raise ProtocolError(ErrorCode.RATE_LIMITED, "too many cancels; slow down",
                                retry_after_ms=int(wait_s * 1000) + 1)
        await cancel_lines(msg, conn, state, host=grant.can_cancel_any)
        return
    if not grant.can_speak:
        raise ProtocolError(ErrorCode.FORBIDDEN, "a listener token cannot speak", seq=msg.seq)
    # An open line's pieces count against the frames budget only (taken above): an LLM writes a
    # few words a second into one line, which the says' budget (lines a second) would refuse.
    if isinstance(msg, protocol.Append):
        await append_piece(msg, conn, state)
        return
    if isinstance(msg, protocol.Flush):
        await flush_line(msg, conn, state)
        return
    wait_s = limits.says.take(time.monotonic())
    if wait_s:
        raise ProtocolError(ErrorCode.RATE_LIMITED, "too many lines; slow down", seq=msg.seq,
                            retry_after_ms=int(wait_s * 1000) + 1)
    await store_line(msg, conn, state)


async def _resume_message(msg: protocol.Resume, conn: ClientConnection, state: GatewayState,
                          limits: _Limits) -> None:
    """The ``resume`` message (the older form of ``?resume=``): honoured when it reorders
    nothing (see :meth:`app.fanout.hub.RoomHub.resume_later`), refused with ``bad_message`` otherwise."""
    wait_s = limits.resumes.take(time.monotonic())
    if wait_s:
        raise ProtocolError(ErrorCode.RATE_LIMITED, "too many resumes; slow down",
                            retry_after_ms=int(wait_s * 1000) + 1)
    point = ResumePoint(msg.seq, msg.chunk)
    try:
        replaying = await state.hub.resume_later(conn, point)
    except ResumeRefused as exc:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, str(exc)) from None
    except REDIS_DOWN:
        raise ProtocolError(ErrorCode.UNAVAILABLE, "storage unavailable; resume later", retry_after_ms=1000) from None
    log.info("client %s in room %s resumed after %s by message: %s", conn.client_id, conn.room, point,
             "replaying" if replaying else "nothing missed")
