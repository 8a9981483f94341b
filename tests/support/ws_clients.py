"""Raw WebSocket helpers for the security tests: connect with any query, Origin or bytes, and
see exactly how the gateway answers (messages, close code, close reason)."""

from __future__ import annotations

import asyncio
import json
from typing import Any
from urllib.parse import urlencode

import redis
import websockets
from websockets.asyncio.client import ClientConnection

from tests.support.room_client import RoomClient


def ws_url(port: int, room: str, **query: str) -> str:
    return f"ws://127.0.0.1:{port}/rooms/{room}/ws" + (f"?{urlencode(query)}" if query else "")


async def connect(url: str, *, origin: str | None = None) -> ClientConnection:
    # No compression: frame sizes on the wire are the sizes the test means. No proxy: localhost.
    return await websockets.connect(url, origin=origin,  # type: ignore[arg-type]
                                    compression=None, proxy=None, max_size=2**22, open_timeout=10)


async def connect_from(port: int, room: str, forwarded_for: str | None) -> ClientConnection:
    """A room socket as a client behind a proxy on this host would open it: ``X-Forwarded-For``
    names the client (uvicorn trusts it from loopback); ``None`` connects as this host itself."""
    if forwarded_for is None:
        return await connect(ws_url(port, room))
    return await websockets.connect(ws_url(port, room), additional_headers={"X-Forwarded-For": forwarded_for},
                                    compression=None, proxy=None, open_timeout=10)


async def close_of(ws: ClientConnection, timeout: float = 10.0) -> tuple[int | None, str]:
    """Read until the server closes; the code and reason it closed with."""
    async def drain() -> None:
        try:
            async for _ in ws:
                pass
        except websockets.ConnectionClosed:
            pass

    await asyncio.wait_for(drain(), timeout)
    return ws.close_code, ws.close_reason or ""


async def refusal(url: str, *, origin: str | None = None) -> tuple[int | None, str]:
    """Open ``url`` and return how the gateway closed it (it accepts, then closes with a reason)."""
    ws = await connect(url, origin=origin)
    try:
        return await close_of(ws)
    finally:
        await ws.close()


async def next_json(ws: ClientConnection, timeout: float = 10.0, *,
                    kind: str | tuple[str, ...] | None = None) -> dict[str, Any]:
    """The next JSON message (of type ``kind``, or one of them, when given), skipping audio frames."""
    kinds = (kind,) if isinstance(kind, str) else kind

    async def read() -> dict[str, Any]:
        while True:
            data = await ws.recv()
            if isinstance(data, str):
                msg: dict[str, Any] = json.loads(data)
                if kinds is None or msg.get("type") in kinds:
                    return msg

    return await asyncio.wait_for(read(), timeout)


class QueryClient(RoomClient):
    """A :class:`RoomClient` that connects with query parameters (``token``, ``client``, ``codec``)."""

    def __init__(self, port: int, room: str, **query: str) -> None:
        super().__init__(port, room)
        self.url = ws_url(port, room, **query)

    async def __aenter__(self) -> QueryClient:
        await super().__aenter__()
        return self

    def errors(self, code: str | None = None) -> list[dict[str, Any]]:
        return [m for m in self.got.of("error") if code is None or m.get("code") == code]


def key_snapshot(redis_url: str) -> dict[bytes, bytes | None]:
    """Every key and its serialized value (``DUMP``): a later snapshot shows what changed."""
    client = redis.Redis.from_url(redis_url)
    try:
        return {key: client.dump(key) for key in client.scan_iter(count=1000)}
    finally:
        client.close()
