"""One client address holds at most ``max_connections_per_address`` room sockets on a gateway.

Before, one script could open all 20,000 of a gateway's sockets from one machine and hold them
idle: every other player was closed with 1013 "gateway full". The table first (pure), then over a
live gateway with a cap of 3, addresses told apart by ``X-Forwarded-For`` (uvicorn trusts it from
loopback, as from an nginx on the same host): the address that is full gets 1013 and keeps its
sockets, every other address gets in, and a closed socket gives its slot back.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator

import pytest
import websockets

from app.room.address_slots import AddressSlots
from tests.conftest import Stack
from tests.support.gauges import wait_connections
from tests.support.processes import Proc, start_gateway
from tests.support.ws_clients import close_of, connect_from, next_json
from voxroom.wire.protocol import CloseCode

CAP = 3


def test_the_table_counts_per_address_and_forgets_an_address_with_no_socket() -> None:
    slots = AddressSlots()
    for _ in range(CAP):
        assert not slots.full("10.0.0.1", CAP)
        slots.take("10.0.0.1")
    assert slots.full("10.0.0.1", CAP) and not slots.full("10.0.0.2", CAP)
    assert not slots.full("10.0.0.1", 0)  # 0: no limit
    slots.give("10.0.0.1")
    assert not slots.full("10.0.0.1", CAP) and slots.held("10.0.0.1") == CAP - 1
    for _ in range(CAP - 1):
        slots.give("10.0.0.1")
    assert len(slots) == 0 and slots.held("10.0.0.1") == 0


@pytest.fixture(scope="module")
def gateway(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, int]]:
    proc, port = start_gateway(stack.redis_url, tmp_path_factory.mktemp("address-cap-gateway"),
                               VOXROOM_MAX_CONNECTIONS_PER_ADDRESS=str(CAP))
    try:
        yield proc, port
    finally:
        proc.stop()


async def _welcomed(port: int, room: str, address: str | None) -> websockets.ClientConnection:
    ws = await connect_from(port, room, address)
    assert (await next_json(ws, kind="welcome"))["room"] == room
    return ws


async def test_a_full_address_gets_1013_and_keeps_its_sockets_while_others_get_in(
        gateway: tuple[Proc, int], room: str) -> None:
    _, port = gateway
    held = [await _welcomed(port, room, "203.0.113.20") for _ in range(CAP)]
    others: list[websockets.ClientConnection] = []
    try:
        # The same address once more, in this room or any other: refused, and told to come back later.
        for where in (room, room + "-b"):
            extra = await connect_from(port, where, "203.0.113.20")
            try:
                code, reason = await close_of(extra)
            finally:
                await extra.close()
            assert (code, reason) == (CloseCode.TRY_AGAIN_LATER,
                                      "too many connections from your address; retry later")
        # Everyone else gets in: another client behind the same proxy, and the proxy's own address.
        others = [await _welcomed(port, room, "203.0.113.21"), await _welcomed(port, room, None)]
        # The full address's own sockets are untouched.
        for i, ws in enumerate(held):
            await ws.send(json.dumps({"type": "ping", "t": float(i)}))
            assert (await next_json(ws, kind="pong"))["t"] == float(i)
        # A socket that closes gives its slot back.
        await held.pop().close()
        assert await wait_connections(port, CAP - 1 + len(others)) == CAP - 1 + len(others)
        held.append(await _welcomed(port, room, "203.0.113.20"))
    finally:
        await asyncio.gather(*(ws.close() for ws in held + others))
    assert await wait_connections(port, 0) == 0
