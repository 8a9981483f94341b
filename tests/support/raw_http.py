"""A raw HTTP/1.1 client for streamed responses: it says whether a chunked body ended with its
terminating chunk, which is how a server says "this is all of it" (httpx and others turn its
absence into an exception and hide how much came; tests need both).

It can read slowly (``rate``: bytes a second), stop reading after the headers (``read=False``: a
client that holds its socket and reads nothing), and pause (``on_piece`` may await). The socket's
receive buffer is small (``rcvbuf``), so that a client that does not read is felt by the server
within a few hundred kilobytes, as from a slow network, instead of after megabytes on loopback.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field


@dataclass
class RawResponse:
    status: int
    headers: dict[str, str]
    body: bytearray = field(default_factory=bytearray)
    complete: bool = False
    """The terminating chunk arrived (for a body that is not chunked: the length it announced)."""
    ended: str = ""
    """How the body ended otherwise: ``eof`` (the connection closed before the terminator),
    ``reset``, ``timeout``, or ``not read``."""

    def json(self) -> object:
        return json.loads(bytes(self.body))


class RawStream:
    """One request on its own connection; :meth:`start` sends it and reads the headers,
    :meth:`read_body` the rest."""

    def __init__(self, port: int, path: str, body: object, *, headers: dict[str, str] | None = None,
                 rcvbuf: int = 16_384) -> None:
        self.port = port
        self.path = path
        self.payload = json.dumps(body).encode()
        self.extra = headers or {}
        self.rcvbuf = rcvbuf
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.response: RawResponse | None = None

    async def start(self, timeout: float = 60.0) -> RawResponse:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, self.rcvbuf)
        sock.setblocking(False)
        await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", self.port))
        self.reader, self.writer = await asyncio.open_connection(sock=sock, limit=self.rcvbuf)
        head = [f"POST {self.path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}", "Content-Type: application/json",
                f"Content-Length: {len(self.payload)}", *(f"{k}: {v}" for k, v in self.extra.items())]
        self.writer.write(("\r\n".join(head) + "\r\n\r\n").encode() + self.payload)
        await self.writer.drain()
        raw = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), timeout)
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:] if line)}
        self.response = RawResponse(status, headers)
        return self.response

    async def read_body(self, *, rate: float | None = None, timeout: float = 120.0,
                        on_piece: Callable[[RawResponse], Awaitable[None]] | None = None) -> RawResponse:
        """The body, read at ``rate`` bytes a second at most (``None``: as fast as it comes);
        ``on_piece`` is awaited after every piece read."""
        assert self.reader is not None and self.response is not None, "start() first"
        resp, reader = self.response, self.reader
        started = time.monotonic()

        async def take(n: int) -> bytes:
            data = await reader.readexactly(n)
            resp.body += data
            if rate is not None:  # hold the pace: never ahead of rate bytes a second
                ahead = len(resp.body) / rate - (time.monotonic() - started)
                if ahead > 0:
                    await asyncio.sleep(ahead)
            if on_piece is not None:
                await on_piece(resp)
            return data

        async def body() -> None:
            if resp.headers.get("transfer-encoding") != "chunked":
                left = int(resp.headers.get("content-length", "0"))
                while left:
                    left -= len(await take(min(left, 4096)))
                resp.complete = True
                return
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip().split(b";")[0], 16)
                if size == 0:
                    await reader.readuntil(b"\r\n")
                    resp.complete = True
                    return
                while size:
                    size -= len(await take(min(size, 4096)))
                await reader.readexactly(2)

        try:
            await asyncio.wait_for(body(), timeout)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            resp.ended = "eof"
        except ConnectionResetError:
            resp.ended = "reset"
        except TimeoutError:
            resp.ended = "timeout"
        return resp

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            try:
                await self.writer.wait_closed()
            except OSError:
                pass


async def post(port: int, path: str, body: object, *, headers: dict[str, str] | None = None,
               **kwargs: object) -> RawResponse:
    """One request, its whole body read (see :meth:`RawStream.read_body` for ``kwargs``)."""
    stream = RawStream(port, path, body, headers=headers)
    try:
        await stream.start()
        return await stream.read_body(**kwargs)  # type: ignore[arg-type]
    finally:
        await stream.close()
