"""A minimal asyncio WebSocket *listener* for benchmarks: thousands per process, cheap per frame.

The benches measure the gateway, so the load generator must cost as little as possible: no
library per-frame machinery, just the handshake, server-frame parsing (servers never mask), pong
replies to the gateway's pings, and for each audio frame its arrival time against the frame's own
presentation time (bytes 20..27 of the voxroom audio header, microseconds on the room clock).
"""

from __future__ import annotations

import asyncio
import base64
import os
import resource
import struct
import time
from collections.abc import Callable
from typing import cast

PTS = struct.Struct(">Q")
PTS_OFFSET = 20  # see voxroom.wire.protocol.AudioFrame: ">2sBBBBHIIIQI"


def raise_nofile(wanted: int) -> int:
    """Raise this process's open-file limit towards ``wanted`` (up to the hard limit, or beyond as root)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = max(soft, wanted)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, max(hard, target)))
    except (ValueError, OSError):
        target = min(target, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


class Listener(asyncio.Protocol):
    """One room WebSocket. ``on_audio(arrival_us, pts_us)`` is called for every audio frame."""

    def __init__(self, host: str, port: int, path: str, on_audio: Callable[[int, int], None] | None = None) -> None:
        self.request = (f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                        f"Connection: Upgrade\r\nSec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\n"
                        "Sec-WebSocket-Version: 13\r\n\r\n").encode()
        self.on_audio = on_audio
        self.buf = bytearray()
        self.upgraded = False
        self.welcomed = asyncio.get_running_loop().create_future()
        self.closed: int | None = None
        self.transport: asyncio.Transport | None = None
        self.frames = 0

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # cast, not isinstance: uvloop's transports are not subclasses of asyncio.Transport.
        self.transport = cast(asyncio.Transport, transport)
        self.transport.write(self.request)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed is None:
            self.closed = 1006
        if not self.welcomed.done():
            self.welcomed.set_exception(ConnectionError(f"closed before welcome ({self.closed})"))

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if not self.upgraded:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            if not buf.startswith(b"HTTP/1.1 101"):
                self.closed = 0
                if not self.welcomed.done():
                    self.welcomed.set_exception(ConnectionError(bytes(buf[:end]).decode("latin-1")))
                assert self.transport is not None
                self.transport.close()
                return
            del buf[:end + 4]
            self.upgraded = True
        while len(buf) >= 2:
            opcode = buf[0] & 0x0F
            length = buf[1] & 0x7F
            head = 2
            if length == 126:
                if len(buf) < 4:
                    return
                length, head = int.from_bytes(buf[2:4], "big"), 4
            elif length == 127:
                if len(buf) < 10:
                    return
                length, head = int.from_bytes(buf[2:10], "big"), 10
            if len(buf) < head + length:
                return
            if opcode == 2:
                self.frames += 1
                self.audio_frame(buf, head)
            elif opcode == 1:
                if not self.welcomed.done() and b'"welcome"' in buf[head:head + length]:
                    self.welcomed.set_result(None)
                else:
                    self.text_frame(bytes(buf[head:head + length]))
            elif opcode == 9:
                self._send(0xA, bytes(buf[head:head + length]))
            elif opcode == 8:
                self.closed = int.from_bytes(buf[head:head + 2], "big") if length >= 2 else 1005
                self._send(0x8, bytes(buf[head:head + min(length, 2)]))
            del buf[:head + length]

    def audio_frame(self, buf: bytearray, head: int) -> None:
        """An audio frame starts at ``buf[head]`` (a subclass may read more of its header)."""
        if self.on_audio is not None:
            self.on_audio(time.time_ns() // 1000, PTS.unpack_from(buf, head + PTS_OFFSET)[0])

    def text_frame(self, data: bytes) -> None:
        """A control message after the welcome (ignored here; a subclass may parse it)."""

    def send_text(self, text: str) -> None:
        """One masked text frame, any length (RFC 6455 5.2). The payload is masked as one big
        integer XOR: per-byte Python would cost more than the server's whole handling of it."""
        payload = text.encode()
        n = len(payload)
        if n < 126:
            head = bytes([0x81, 0x80 | n])
        elif n < 1 << 16:
            head = bytes([0x81, 0x80 | 126]) + n.to_bytes(2, "big")
        else:
            head = bytes([0x81, 0x80 | 127]) + n.to_bytes(8, "big")
        mask = os.urandom(4)
        key = (mask * (n // 4 + 1))[:n]
        masked = (int.from_bytes(payload, "big") ^ int.from_bytes(key, "big")).to_bytes(n, "big")
        assert self.transport is not None
        self.transport.write(head + mask + masked)

    def _send(self, opcode: int, payload: bytes) -> None:
        """Client frames must be masked (RFC 6455 5.3); control payloads are under 126 bytes."""
        mask = os.urandom(4)
        masked = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(bytes([0x80 | opcode, 0x80 | len(payload)]) + mask + masked)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self._send(0x8, (1000).to_bytes(2, "big"))
            self.transport.close()


async def connect(host: str, port: int, path: str, on_audio: Callable[[int, int], None] | None = None,
                  timeout: float = 30.0, kind: type[Listener] = Listener) -> Listener:
    loop = asyncio.get_running_loop()
    _, listener = await asyncio.wait_for(
        loop.create_connection(lambda: kind(host, port, path, on_audio), host, port), timeout)
    await asyncio.wait_for(listener.welcomed, timeout)
    return listener


def percentiles(values: list[float], points: tuple[float, ...] = (50, 95, 99)) -> list[float]:
    if not values:
        return [float("nan")] * len(points)
    ordered = sorted(values)
    return [ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] for p in points]
