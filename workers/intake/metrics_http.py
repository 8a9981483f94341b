"""A tiny HTTP server for a worker's ``GET /metrics``, on the worker's own event loop.

Why not ``prometheus_client.start_http_server``: it runs a threading HTTP server (a thread per
request) whose collectors would read the context pool from another thread while the loop changes
it. Here a scrape is one coroutine on the loop: the collector sees the pool between two loop
steps, and no thread is added. Rendering takes well under a millisecond for a worker's few dozen
series, a cost the loop already pays for a handful of slices.

It speaks just enough HTTP/1.1 for Prometheus and curl: one request per connection (answered with
``Connection: close``), ``GET``/``HEAD`` of ``/metrics`` (``/`` too), 404 otherwise. Bounded:
at most :data:`MAX_CONNECTIONS` open (more are closed at once), request heads up to 8 KiB, and
:data:`REQUEST_TIMEOUT_S` to send one (a silent client cannot hold a slot).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

log = logging.getLogger("voxroom.worker.metrics")

MAX_CONNECTIONS = 16
REQUEST_TIMEOUT_S = 5.0
HEAD_LIMIT = 8192


class MetricsServer:
    def __init__(self, registry: CollectorRegistry, *, host: str = "127.0.0.1", port: int) -> None:
        self.registry = registry
        self.host = host
        self.port = port
        self._server: asyncio.Server | None = None
        self._open: set[asyncio.StreamWriter] = set()

    async def start(self) -> int | None:
        """Listen; the port bound (``port`` may be 0 for any free one, in tests), or ``None``
        when it cannot listen (logged once: the worker serves audio without metrics rather
        than not at all)."""
        try:
            self._server = await asyncio.start_server(self._serve, self.host, self.port, limit=HEAD_LIMIT)
        except OSError as exc:
            log.error("worker metrics: cannot listen on %s:%d (%s); /metrics is off for this worker. Several "
                      "workers on one host need one VOXROOM_WORKER_METRICS_PORT each", self.host, self.port, exc)
            return None
        port: int = self._server.sockets[0].getsockname()[1]
        log.info("worker metrics on http://%s:%d/metrics", self.host, port)
        return port

    async def aclose(self) -> None:
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._open):
            writer.close()
        await self._server.wait_closed()
        self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._open) >= MAX_CONNECTIONS:
            writer.close()
            return
        self._open.add(writer)
        try:
            async with asyncio.timeout(REQUEST_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
                status, body, content_type = self._answer(head)
                writer.write(b"HTTP/1.1 %s\r\nContent-Type: %s\r\nContent-Length: %d\r\nConnection: close\r\n\r\n"
                             % (status, content_type, len(body)))
                if not head.startswith(b"HEAD "):
                    writer.write(body)
                await writer.drain()
        except (TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass  # a client that left, stalled or sent a huge head: nothing to answer
        finally:
            self._open.discard(writer)
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    def _answer(self, head: bytes) -> tuple[bytes, bytes, bytes]:
        parts = head.split(b"\r\n", 1)[0].split()
        if len(parts) != 3 or parts[0] not in (b"GET", b"HEAD"):
            return b"405 Method Not Allowed", b"GET /metrics only\n", b"text/plain"
        if parts[1].split(b"?", 1)[0] not in (b"/metrics", b"/"):
            return b"404 Not Found", b"GET /metrics only\n", b"text/plain"
        return b"200 OK", generate_latest(self.registry), CONTENT_TYPE_LATEST.encode()
