"""A ``POST /v1/audio/speech`` response on the wire: streamed, and never a lie about its end.

A streamed body (chunked transfer) says it is complete with its terminating chunk. So a response
that cannot be finished whole (Redis lost, no worker output in time, a line failed or restarted
as other audio: :class:`~voxroom.errors.ResponseCut`, raised by the body) must not send it: the
connection is closed instead, after what was already written (as an HTTP server does when its
application fails mid-stream; uvicorn closes the transport then too, with a traceback in its log),
and every HTTP client reports an incomplete body (httpx ``RemoteProtocolError``, curl exit 18,
the OpenAI SDK's read error). One warning is logged and ``voxroom_speech_cut_total`` counted.

A client that stops reading would otherwise hold its stream slot for as long as it keeps the
socket: as for room sockets (app/fanout/connection.py, app/room/reaper.py), the kernel's send buffer is bounded
(``send_buffer_bytes``) and a body write blocked for ``send_stall_close_s`` aborts the connection
and frees the slot. The client's going away ends the response at once (a task waits for it).

Only uvicorn gives the application its transport (app/fanout/transport.py): under another server a cut
is raised to it, and there is no stall limit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, Final

import anyio
from prometheus_client import Counter
from starlette.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from app.fanout.transport import SCOPE_KEY, limit_transport_send_buffer
from voxroom.errors import ResponseCut
from voxroom.runtime import metrics

log = logging.getLogger("voxroom.gateway.speech")

CLOSE_WAIT_S: Final = 1.0
"""How long a cut connection may take to flush what was written before it is aborted."""

CUTS = Counter("voxroom_speech_cut_total",
               "POST /v1/audio/speech responses ended without their terminating chunk, by reason: redis, "
               "timeout, failed, busy, gap, takes_differ (the response could not be finished whole) or "
               "stalled (its client read nothing for send_stall_close_s).",
               ["reason"], registry=metrics.REGISTRY)


class _Stalled(Exception):
    pass


class SpeechStream(StreamingResponse):
    """``body`` streamed; ``on_end`` awaited however the response ends (shielded), also when the
    client was gone before the first byte."""

    def __init__(self, body: AsyncIterator[bytes], *, media_type: str, headers: Mapping[str, str], name: str,
                 stall_s: float, send_buffer_bytes: int, on_end: Callable[[], Awaitable[None]]) -> None:
        super().__init__(body, media_type=media_type, headers=headers)
        self._name = name
        self._stall_s = stall_s
        self._send_buffer_bytes = send_buffer_bytes
        self._on_end = on_end

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        transport: Any = scope.get(SCOPE_KEY)
        gone = anyio.Event()
        try:
            if transport is not None:
                limit_transport_send_buffer(transport, self._send_buffer_bytes)
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(self._watch, receive, gone, tasks.cancel_scope)
                try:
                    await self._stream(send, math.inf if transport is None else self._stall_s)
                except ResponseCut as cut:
                    CUTS.labels(cut.reason).inc()
                    log.warning("speech room %s: %s (%s); closing the connection before the end of the body",
                                self._name, cut, cut.reason)
                    if transport is None:
                        raise
                    transport.close()  # what was written still goes out, then the end of the connection
                    await self._until(gone, transport)
                except _Stalled:
                    CUTS.labels("stalled").inc()
                    log.warning("speech room %s: the client read nothing for %g s; aborting its connection and freeing "
                                "its stream slot", self._name, self._stall_s)
                    transport.abort()
                    await self._until(gone, None)
                tasks.cancel_scope.cancel()
        finally:
            with anyio.CancelScope(shield=True):
                aclose = getattr(self.body_iterator, "aclose", None)
                if aclose is not None:
                    await aclose()
                await self._on_end()

    async def _stream(self, send: Send, stall_s: float) -> None:
        await self._send(send, {"type": "http.response.start", "status": self.status_code,
                                "headers": self.raw_headers}, stall_s)
        async for chunk in self.body_iterator:
            data = chunk if isinstance(chunk, bytes | memoryview) else chunk.encode(self.charset)
            await self._send(send, {"type": "http.response.body", "body": data, "more_body": True}, stall_s)
        await self._send(send, {"type": "http.response.body", "body": b"", "more_body": False}, stall_s)

    @staticmethod
    async def _send(send: Send, message: Message, stall_s: float) -> None:
        """uvicorn's ``send`` waits while its transport is paused (the client's buffers full);
        cancelling that wait writes nothing of the message."""
        with anyio.move_on_after(stall_s) as scope:
            await send(message)
        if scope.cancelled_caught:
            raise _Stalled

    @staticmethod
    async def _watch(receive: Receive, gone: anyio.Event, response: anyio.CancelScope) -> None:
        """The client gone (or the response complete): nothing more to do for it."""
        while (await receive())["type"] != "http.disconnect":
            pass
        gone.set()
        response.cancel()

    @staticmethod
    async def _until(gone: anyio.Event, transport: Any) -> None:
        """Wait for the connection to be lost (uvicorn then takes the unfinished response as the
        client's leaving, not as an application error); abort ``transport`` if it takes more than
        :data:`CLOSE_WAIT_S` (a client that reads nothing never takes what was written)."""
        with anyio.move_on_after(CLOSE_WAIT_S):
            await gone.wait()
        if not gone.is_set() and transport is not None:
            transport.abort()
            with anyio.move_on_after(CLOSE_WAIT_S):
                await gone.wait()
