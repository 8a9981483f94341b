"""A real WebSocket room client for tests: collects control messages and audio frames."""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import numpy as np
import numpy.typing as npt
import websockets

from tests.support.waiting import scaled
from voxroom.wire.protocol import AudioFrame


@dataclass
class Received:
    messages: list[dict[str, Any]] = field(default_factory=list)
    frames: list[AudioFrame] = field(default_factory=list)
    frame_times: list[float] = field(default_factory=list)
    stream: list[dict[str, Any] | AudioFrame] = field(default_factory=list)
    """Messages and frames together, in the order they arrived."""

    def of(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.messages if m.get("type") == kind]

    def ends(self) -> list[dict[str, Any]]:
        return self.of("end")

    def audio(self, utterance: int) -> npt.NDArray[np.int16]:
        parts = [np.frombuffer(f.payload, dtype="<i2") for f in self.frames if f.seq == utterance]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)

    def frames_of(self, utterance: int) -> list[AudioFrame]:
        return [f for f in self.frames if f.seq == utterance]


def resume_point(got: Received) -> str | None:
    """The ``?resume=`` value for what ``got`` holds: the last room entry received (frames and
    ``start``/``end`` arrive in stream order, so that one entry says where the client is)."""
    last: str | None = None
    for message in got.stream:
        if isinstance(message, AudioFrame):
            last = f"{message.seq}.{message.chunk}"
        elif message.get("type") == "start":
            last = f"{message['utterance']}.start"
        elif message.get("type") == "end":
            last = f"{message['utterance']}.end"
    return last


class RoomClient:
    def __init__(self, port: int, room: str, *, client: str | None = None, host: str = "127.0.0.1",
                 resume: str | None = None, token: str | None = None) -> None:
        """``resume``: what this client already holds (``?resume=``, docs/protocol.md), e.g.
        ``resume_point(received)``; ``token``: a room token (auth on)."""
        query = {k: v for k, v in (("client", client), ("resume", resume), ("token", token)) if v}
        self.url = f"ws://{host}:{port}/rooms/{room}/ws" + (f"?{urlencode(query)}" if query else "")
        self.got = Received()
        self.ws: websockets.ClientConnection | None = None
        self._reader: asyncio.Task[None] | None = None
        self._changed = asyncio.Event()
        self._seq = 0
        self.closed: tuple[int | None, str | None] | None = None

    async def __aenter__(self) -> RoomClient:
        self.ws = await websockets.connect(self.url, max_size=2**20)
        self._reader = asyncio.create_task(self._read(), name=f"test-client:{self.url}")
        await self.wait_for(lambda g: bool(g.of("welcome")), 10)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.ws is not None:
            await self.ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)

    async def _read(self) -> None:
        assert self.ws is not None
        try:
            async for message in self.ws:
                if isinstance(message, bytes):
                    self.got.frames.append(AudioFrame.decode(message))
                    self.got.frame_times.append(time.time() * 1000.0)
                    self.got.stream.append(self.got.frames[-1])
                else:
                    self.got.messages.append(json.loads(message))
                    self.got.stream.append(self.got.messages[-1])
                self._changed.set()
        except websockets.ConnectionClosed:
            pass
        finally:
            # websockets' new asyncio API: the close frame the server sent (None when the TCP
            # connection just died, as with a killed gateway: then code is 1006).
            self.closed = (self.ws.close_code, self.ws.close_reason)
            self._changed.set()

    async def send_json(self, obj: dict[str, Any]) -> None:
        assert self.ws is not None
        await self.ws.send(json.dumps(obj))

    async def send_raw(self, data: str | bytes) -> None:
        assert self.ws is not None
        await self.ws.send(data)

    async def say(self, text: str, voice: str | None = None, seq: int | None = None, *,
                  to: list[str] | None = None) -> int:
        """Send a ``say`` (``to``: a private line's audience); its seq."""
        self._seq = seq if seq is not None else self._seq + 1
        msg: dict[str, Any] = {"type": "say", "seq": self._seq, "text": text}
        if voice:
            msg["voice"] = voice
        if to is not None:
            msg["to"] = to
        await self.send_json(msg)
        return self._seq

    async def wait_for(self, predicate: Any, timeout: float) -> None:
        timeout = scaled(timeout)
        deadline = asyncio.get_running_loop().time() + timeout
        while not predicate(self.got):
            if self.closed is not None and not predicate(self.got):
                raise AssertionError(f"connection closed {self.closed} before the condition held")
            remaining = deadline - asyncio.get_running_loop().time()
            if remaining <= 0:
                raise TimeoutError(f"condition not met in {timeout} s; got {self.got.messages[-5:]}")
            self._changed.clear()
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                pass

    async def wait_ends(self, n: int, timeout: float = 30.0) -> list[dict[str, Any]]:
        await self.wait_for(lambda g: len(g.ends()) >= n, timeout)
        return self.got.ends()
