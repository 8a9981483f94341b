"""A client's queued messages leave in one socket write (app/fanout/transport.py ``BatchSend``), framed
exactly as uvicorn frames them one by one: bytes out of the writer, parsed back by a WebSocket
client's sans-I/O parser."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

from starlette.websockets import WebSocket, WebSocketState
from websockets.frames import Frame, Opcode
from websockets.protocol import State
from websockets.server import ServerProtocol
from websockets.streams import StreamReader

from app.fanout.connection import ClientConnection
from app.fanout.transport import PROTOCOL_KEY, BatchSend


class FakeTransport:
    """What the writer may touch of uvicorn's transport; records every write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.buffered = 0

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return False

    def get_write_buffer_size(self) -> int:
        return self.buffered


def open_socket() -> tuple[WebSocket, FakeTransport, list[dict[str, Any]]]:
    """A Starlette-like WebSocket over uvicorn's websockets-sansio protocol shape, open. ASGI
    sends (the one-at-a-time path) are recorded in the returned list."""
    conn = ServerProtocol()
    conn.state = State.OPEN
    transport = FakeTransport()
    writable = asyncio.Event()
    writable.set()
    protocol = SimpleNamespace(conn=conn, transport=transport, writable=writable, disconnected=False,
                               close_sent=False, handshake_complete=True, initial_response=None)
    asgi_sends: list[dict[str, Any]] = []

    async def send_bytes(data: bytes) -> None:
        asgi_sends.append({"bytes": data})

    async def send_text(data: str) -> None:
        asgi_sends.append({"text": data})

    ws = SimpleNamespace(scope={PROTOCOL_KEY: protocol}, application_state=WebSocketState.CONNECTED,
                         send_bytes=send_bytes, send_text=send_text)
    return cast(WebSocket, ws), transport, asgi_sends


def frames_in(data: bytes) -> list[tuple[Opcode, bytes]]:
    """The frames a WebSocket client reads out of ``data`` (a server's frames: unmasked), each
    parsed by websockets' own frame parser."""
    reader = StreamReader()
    reader.feed_data(data)
    reader.feed_eof()
    out: list[tuple[Opcode, bytes]] = []
    while reader.buffer:
        parser = Frame.parse(reader.read_exact, mask=False)
        try:
            next(parser)
        except StopIteration as done:
            frame: Frame = done.value
            assert frame.fin
            out.append((frame.opcode, bytes(frame.data)))
        else:
            raise AssertionError("a frame cut short")
    return out


async def test_queued_messages_leave_in_one_write_in_order() -> None:
    ws, transport, asgi_sends = open_socket()
    conn = ClientConnection(ws, room="r", client_id="c")
    conn.send_text('{"type":"start","utterance":1}')
    conn.send_audio(b"\x01" * 40)
    conn.send_audio(b"\x02" * 40)
    writer = asyncio.create_task(conn.run_writer())
    await asyncio.sleep(0.01)
    conn.close()
    await writer
    assert len(transport.writes) == 1 and not asgi_sends
    assert frames_in(transport.writes[0]) == [
        (Opcode.TEXT, b'{"type":"start","utterance":1}'), (Opcode.BINARY, b"\x01" * 40),
        (Opcode.BINARY, b"\x02" * 40)]
    assert conn.sent_audio == 2


async def test_a_client_not_keeping_up_gets_one_asgi_send_at_a_time() -> None:
    """Unsent bytes in the transport: the writer falls back to ASGI sends (which wait for the
    socket), so what the client has not taken stays in the queue, under its overflow policy."""
    ws, transport, asgi_sends = open_socket()
    transport.buffered = 1
    conn = ClientConnection(ws, room="r", client_id="c")
    conn.send_text("hello")
    conn.send_audio(b"\x03" * 8)
    writer = asyncio.create_task(conn.run_writer())
    await asyncio.sleep(0.01)
    conn.close()
    await writer
    assert transport.writes == []
    assert asgi_sends == [{"text": "hello"}, {"bytes": b"\x03" * 8}]


def test_no_batching_without_uvicorns_sans_io_protocol() -> None:
    ws = cast(WebSocket, SimpleNamespace(scope={PROTOCOL_KEY: object()},
                                         application_state=WebSocketState.CONNECTED))
    assert BatchSend.of(ws) is None
    ws_none = cast(WebSocket, SimpleNamespace(scope={}, application_state=WebSocketState.CONNECTED))
    assert BatchSend.of(ws_none) is None
