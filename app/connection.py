"""One client's outbound side: a bounded queue and a writer task.

The room's fan-out never waits for a client: it appends to the client's queue and moves on. The
writer task is the only thing that awaits the socket, so a client that stops reading blocks only
its own writer. Policy when the queue is full (``limit`` frames, 2 s of audio by default): drop
the *oldest audio* frame (it is the one most likely already too late to play) and count it;
control messages are never dropped. A client whose queue is all control messages and still full
is hopeless and is disconnected with 1013.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque

from starlette.websockets import WebSocket

from voxroom.protocol import CODEC_PCM16, CloseCode

log = logging.getLogger("voxroom.gateway.connection")


class ClientConnection:
    # Thousands of these live in one process: no per-instance __dict__.
    __slots__ = ("_closed", "_queue", "_ready", "client_id", "codec", "dropped_audio", "joined_at", "limit",
                 "overflowed", "room", "sent_audio", "websocket")

    def __init__(self, websocket: WebSocket, *, room: str, client_id: str, limit: int = 50,
                 codec: int = CODEC_PCM16) -> None:
        self.websocket = websocket
        self.codec = codec
        self.joined_at: str | None = None
        """The room output stream id this client's live delivery starts after (set by the hub)."""
        """Which copy of each audio frame this client gets (``?codec=`` on the WebSocket URL)."""
        self.room = room
        self.client_id = client_id
        self.limit = limit
        self._queue: deque[str | bytes] = deque()
        self._ready = asyncio.Event()
        self._closed = False
        self.sent_audio = 0
        self.dropped_audio = 0
        self.overflowed = False

    def prepend(self, items: list[str | bytes]) -> None:
        """Queue ``items`` ahead of everything waiting (a resume's replay comes before live audio).
        The replay is bounded by the room output stream's MAXLEN, so the queue may hold up to
        ``limit`` plus that for as long as the client takes to drain it; live audio arriving
        meanwhile follows the usual drop-oldest policy."""
        if self._closed or not items:
            return
        self._queue.extendleft(reversed(items))
        self._ready.set()

    def send_text(self, text: str) -> None:
        self._push(text)

    def send_audio(self, frame: bytes) -> None:
        self._push(frame)

    def _push(self, item: str | bytes) -> None:
        if self._closed:
            return
        if len(self._queue) >= self.limit:
            for i, queued in enumerate(self._queue):
                if isinstance(queued, bytes):
                    del self._queue[i]
                    self.dropped_audio += 1
                    break
            else:
                self.overflowed = True
                self._closed = True
                self._ready.set()
                return
        self._queue.append(item)
        self._ready.set()

    @property
    def depth(self) -> int:
        return len(self._queue)

    async def run_writer(self) -> None:
        """Send queued frames until :meth:`close`; returns when the socket fails."""
        ws = self.websocket
        while True:
            while not self._queue:
                if self._closed:
                    break
                self._ready.clear()
                await self._ready.wait()
            if not self._queue:
                break
            item = self._queue.popleft()
            if isinstance(item, bytes):
                await ws.send_bytes(item)
                self.sent_audio += 1
            else:
                await ws.send_text(item)
        if self.overflowed:
            log.warning("client %s in room %s could not keep up; disconnecting", self.client_id, self.room)
            await ws.close(CloseCode.TRY_AGAIN_LATER, "send queue overflow")

    def close(self) -> None:
        self._closed = True
        self._ready.set()
