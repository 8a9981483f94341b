"""One client's outbound side: a bounded queue and a writer task.

The room's fan-out never waits for a client: it appends to the client's queue and moves on. The
writer task is the only thing that awaits the socket, so a client that stops reading blocks only
its own writer. Policy when the queue is full (``limit`` frames, 2 s of audio by default): drop
the *oldest audio* frame (it is the one most likely already too late to play) and count it;
control messages are never dropped. A client whose queue is all control messages and still full
is hopeless and is disconnected with 1013.

A client that stopped reading altogether (its queue full, or its socket write blocked, for
``send_stall_close_s``) is *reaped* (:meth:`ClientConnection.reap`, called by the gateway's reaper
loop): its queue is freed at once and the connection closed with 1013, or aborted when not even
the close frame can be written.

A resuming client is fed from Redis at the pace its queue drains (``app/fanout/catchup.py`` waits on
:meth:`ClientConnection.wait_space`), so a replay never holds more than ``limit`` frames either.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque

from starlette.websockets import WebSocket

from app.fanout.transport import BatchSend, abort
from voxroom.wire.protocol import CODEC_PCM16, CloseCode

log = logging.getLogger("voxroom.gateway.connection")

REAP_CLOSE_S = 1.0
"""How long a reaped connection's close frame may take before the TCP connection is aborted."""
WRITE_BATCH = 32
"""Most queued messages framed into one socket write (about 64 kB of PCM slices)."""


class ClientConnection:
    # Thousands of these live in one process: no per-instance __dict__.
    __slots__ = ("_closed", "_full_since", "_queue", "_ready", "_send_since", "_space", "_space_at", "client_id",
                 "codec", "dropped_audio", "joined_at", "limit", "overflowed", "reaped", "room", "sent_audio",
                 "websocket")

    def __init__(self, websocket: WebSocket, *, room: str, client_id: str, limit: int = 50,
                 codec: int = CODEC_PCM16) -> None:
        self.websocket = websocket
        self.codec = codec
        """Which copy of each audio frame this client gets (``?codec=`` on the WebSocket URL)."""
        self.joined_at: str | None = None
        """The room output stream id this client's live delivery starts after (set by the hub)."""
        self.room = room
        self.client_id = client_id
        self.limit = limit
        self._queue: deque[str | bytes] = deque()
        self._ready = asyncio.Event()
        self._closed = False
        self._full_since: float | None = None
        """Monotonic time the queue last became full (None while it has room)."""
        self._send_since: float | None = None
        """Monotonic time the writer began the socket write it is still waiting on."""
        self._space: asyncio.Event | None = None
        self._space_at = 0
        self.sent_audio = 0
        self.dropped_audio = 0
        self.overflowed = False
        self.reaped: str | None = None
        """Why the gateway gave up on this client (set by :meth:`reap`)."""

    def send_text(self, text: str) -> None:
        self._push(text)

    def send_audio(self, frame: bytes) -> None:
        self._push(frame)

    def _push(self, item: str | bytes) -> None:
        if self._closed:
            return
        if len(self._queue) >= self.limit:
            if self._full_since is None:
                self._full_since = time.monotonic()
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

    @property
    def closed(self) -> bool:
        return self._closed

    def stalled_for(self, now: float) -> float:
        """Seconds this client has been unable to take what is sent (queue full or a write
        blocked); 0 when it is keeping up."""
        since = [t for t in (self._full_since, self._send_since) if t is not None]
        return now - min(since) if since else 0.0

    async def wait_space(self, depth: int) -> None:
        """Return once at most ``depth`` items are queued (or the connection is closed). One
        waiter at a time: the client's catch-up task."""
        while len(self._queue) > depth and not self._closed:
            self._space_at = depth
            self._space = event = asyncio.Event()
            try:
                await event.wait()
            finally:
                self._space = None

    async def run_writer(self) -> None:
        """Send queued frames until :meth:`close`; returns when the socket fails.

        What is queued when the writer wakes (a line's ``start`` with its first frame, the
        frames of a paced group, every room's messages of one loop turn) goes out in one socket
        write (:class:`app.fanout.transport.BatchSend`) while the client keeps up; a client whose
        socket holds unsent bytes gets one ASGI send at a time, which waits for the socket, so
        what it has not taken stays in this queue, where the overflow policy applies."""
        ws = self.websocket
        queue = self._queue
        batch = BatchSend.of(ws)
        while True:
            while not queue:
                if self._closed:
                    break
                self._ready.clear()
                await self._ready.wait()
            if not queue:
                break
            if batch is not None and len(queue) > 1 and batch.ready():
                items = [queue.popleft() for _ in range(min(len(queue), WRITE_BATCH))]
                self._taken()
                batch.write(items)  # synchronous: nothing to wait for, so no stall to time
                self.sent_audio += sum(1 for item in items if isinstance(item, bytes))
                continue
            item = queue.popleft()
            self._taken()
            self._send_since = time.monotonic()
            if isinstance(item, bytes):
                await ws.send_bytes(item)
                self.sent_audio += 1
            else:
                await ws.send_text(item)
            self._send_since = None
        if self.overflowed and self.reaped is None:
            log.warning("client %s in room %s could not keep up; disconnecting", self.client_id, self.room)
            await ws.close(CloseCode.TRY_AGAIN_LATER, "send queue overflow")

    def _taken(self) -> None:
        """Items left the queue: it may have room again, and a catch-up may be waiting for that."""
        if self._full_since is not None and len(self._queue) < self.limit:
            self._full_since = None
        if self._space is not None and len(self._queue) <= self._space_at:
            self._space.set()

    def close(self) -> None:
        self._closed = True
        self._ready.set()
        if self._space is not None:
            self._space.set()

    async def reap(self, reason: str) -> None:
        """Give up on a client that stopped reading: free its queue now, close with 1013 and
        ``reason``, and abort the TCP connection if the close frame cannot be written within
        :data:`REAP_CLOSE_S` (its socket buffers are full: the close would wait forever)."""
        if self.reaped is not None:
            return
        self.reaped = reason
        self.close()
        self.dropped_audio += sum(1 for item in self._queue if isinstance(item, bytes))
        self._queue.clear()
        await self.close_socket(CloseCode.TRY_AGAIN_LATER, reason)

    async def close_socket(self, code: int, reason: str) -> None:
        """Send a close frame, or abort the TCP connection when that cannot be written within
        :data:`REAP_CLOSE_S` (a client that reads nothing would hold the close forever)."""
        with contextlib.suppress(Exception):  # whatever state the socket is in, it is going away
            async with asyncio.timeout(REAP_CLOSE_S):
                await self.websocket.close(code, reason)
                return
        abort(self.websocket)
