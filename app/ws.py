"""The room WebSocket: ``/rooms/{room_id}/ws``.

One coroutine per connection reads control frames; a writer task (see ``connection.py``) sends.
Every recoverable problem is answered with a typed ``error`` message and the connection stays
open; only binary garbage (1003), policy violations (1008) and shutdown (1012) close it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from starlette.websockets import WebSocket, WebSocketDisconnect

from app.connection import ClientConnection
from app.state import GatewayState
from voxroom import metrics, protocol
from voxroom.errors import UnknownVoice
from voxroom.protocol import CloseCode, ErrorCode, ProtocolError
from voxroom.voice_search import resolve_scene

log = logging.getLogger("voxroom.gateway.ws")


async def room_endpoint(websocket: WebSocket) -> None:
    state: GatewayState = websocket.app.state.voxroom
    room = websocket.path_params["room_id"]
    if not protocol.valid_room_id(room):
        await websocket.accept()
        await websocket.close(CloseCode.POLICY_VIOLATION, "bad room id: 1-64 of A-Z a-z 0-9 _ -")
        return
    if state.connections >= state.settings.max_connections or state.draining:
        await websocket.accept()
        code = CloseCode.SERVICE_RESTART if state.draining else CloseCode.TRY_AGAIN_LATER
        metrics.CONNECTIONS_REFUSED.labels(str(code)).inc()
        await websocket.close(code, "gateway full; retry later" if not state.draining else "restarting")
        return
    client_id = websocket.query_params.get("client") or uuid.uuid4().hex[:12]
    if not protocol.valid_room_id(client_id):
        await websocket.accept()
        await websocket.close(CloseCode.POLICY_VIOLATION, "bad client id")
        return
    codec = protocol.CODECS_BY_NAME.get(websocket.query_params.get("codec") or "pcm16")
    if codec is None:
        await websocket.accept()
        await websocket.close(CloseCode.POLICY_VIOLATION, "codec must be pcm16 or opus")
        return
    await websocket.accept()
    conn = ClientConnection(websocket, room=room, client_id=client_id, limit=state.settings.send_queue_slices,
                            codec=codec)
    state.connections += 1
    state.clients.add(conn)
    writer = asyncio.create_task(conn.run_writer(), name=f"room:{room}:client:{client_id}:writer")
    try:
        await state.hub.join(conn)
        conn.send_text(protocol.encode_server_message({
            "type": "welcome", "protocol": protocol.PROTOCOL_VERSION, "room": room, "client": client_id,
            "sample_rate": protocol.ROOM_RATE, "slice_ms": protocol.SLICE_MS, "voice": state.catalog.default,
            "server_ms": time.time() * 1000.0, "codec": protocol.CODEC_NAMES[codec]}))
        await _receive_loop(websocket, conn, state, writer)
    finally:
        conn.close()
        await state.hub.leave(conn)
        state.clients.discard(conn)
        state.connections -= 1
        metrics.CLOSED_CLIENTS.client_closed(conn.sent_audio, conn.dropped_audio)
        await asyncio.wait([writer], timeout=1.0)
        if not writer.done():
            writer.cancel()
            await asyncio.gather(writer, return_exceptions=True)


async def _receive_loop(websocket: WebSocket, conn: ClientConnection, state: GatewayState,
                        writer: asyncio.Task[None]) -> None:
    while True:
        receive = asyncio.ensure_future(websocket.receive())
        done, _ = await asyncio.wait([receive, writer], return_when=asyncio.FIRST_COMPLETED)
        if receive not in done:  # the writer ended: socket gone or client hopelessly slow
            receive.cancel()
            return
        message = receive.result()
        if message["type"] == "websocket.disconnect":
            return
        data = message.get("text")
        if data is None:
            data = message.get("bytes") or b""
        try:
            parsed = protocol.parse_client_message(protocol.decode_client_frame(data))
            await _handle(parsed, conn, state)
        except ProtocolError as exc:
            metrics.ERRORS.labels(exc.code).inc()
            if exc.fatal:
                conn.close()
                await websocket.close(CloseCode.UNSUPPORTED_DATA, exc.message[:120])
                raise WebSocketDisconnect(CloseCode.UNSUPPORTED_DATA) from None
            conn.send_text(protocol.encode_server_message(
                protocol.error_message(exc.code, exc.message, seq=exc.seq, retry_after_ms=exc.retry_after_ms)))


async def _handle(msg: protocol.ClientMessage, conn: ClientConnection, state: GatewayState) -> None:
    if isinstance(msg, protocol.Ping):
        conn.send_text(protocol.encode_server_message(
            {"type": "pong", "t": msg.t, "server_ms": time.time() * 1000.0}))
        return
    if isinstance(msg, protocol.Resume):
        return  # resume is served by the reliability layer; accepted and ignored until then
    try:
        voice = (resolve_scene(state.catalog, msg.scene, lambda v: state.directory.serves(v.id))
                 if msg.scene is not None else state.catalog.get(msg.voice))
    except UnknownVoice as exc:
        raise ProtocolError(ErrorCode.UNKNOWN_VOICE, str(exc), seq=msg.seq) from None
    if not state.directory.serves(voice.id):
        raise ProtocolError(ErrorCode.UNKNOWN_VOICE,
                            f"voice {voice.id!r} needs engine {voice.engine!r}, which no worker runs", seq=msg.seq)
    outcome = await state.ingress.say(conn.room, conn.client_id, msg.seq, msg.text, voice.id)
    if outcome.status == "accepted":
        metrics.FIRST_AUDIO.accepted(conn.room, outcome.utterance)
        conn.send_text(protocol.encode_server_message(
            {"type": "accepted", "seq": msg.seq, "utterance": outcome.utterance}))
    elif outcome.status == "duplicate":
        raise ProtocolError(ErrorCode.DUPLICATE,
                            f"seq {msg.seq} already accepted (last {outcome.utterance}); ignored", seq=msg.seq)
    else:
        backlog = outcome.utterance
        raise ProtocolError(ErrorCode.BUSY, f"room has {backlog} utterances waiting; retry later",
                            seq=msg.seq, retry_after_ms=500 + 250 * backlog)
