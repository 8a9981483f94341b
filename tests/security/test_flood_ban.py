"""Reconnecting after a flood close: refused (1008) from the same address for ``flood_ban_s``.

The ban table first, with the clock passed in (pure); then over a live gateway with small limits.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterator

import pytest
import websockets

from app.room.floodban import FloodBans
from tests.conftest import Stack
from tests.support.processes import Proc, start_gateway
from tests.support.ws_clients import QueryClient, close_of, connect, connect_from, next_json, ws_url
from voxroom.wire.protocol import CloseCode

# --- the table ------------------------------------------------------------------------------------


def test_a_ban_lasts_until_its_end_and_is_then_forgotten() -> None:
    bans = FloodBans()
    bans.ban("10.0.0.1", until=130.0)
    assert bans.remaining("10.0.0.1", now=100.0) == pytest.approx(30.0)
    assert bans.remaining("10.0.0.2", now=100.0) == 0.0
    assert bans.remaining("10.0.0.1", now=130.0) == 0.0
    assert len(bans) == 0


def test_the_table_is_bounded_and_evicts_the_oldest_ban() -> None:
    bans = FloodBans(max_entries=3)
    for i in range(5):
        bans.ban(f"10.0.0.{i}", until=100.0 + i)
    assert len(bans) == 3
    assert [bans.remaining(f"10.0.0.{i}", now=50.0) > 0 for i in range(5)] == [False, False, True, True, True]
    bans.ban("10.0.0.2", until=200.0)  # banned again: now the newest, not the next evicted
    bans.ban("10.0.0.9", until=201.0)
    assert bans.remaining("10.0.0.2", now=50.0) > 0 and bans.remaining("10.0.0.3", now=50.0) == 0.0


# --- over a live gateway --------------------------------------------------------------------------

FRAME_RATE, FRAME_BURST, FLOOD_CLOSE_AFTER = 20, 40, 50
FLOOD_BAN_S = 10.0  # the reconnect right after the flood must come within it, on a busy machine too


@pytest.fixture(scope="module")
def gateway(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, int]]:
    proc, port = start_gateway(stack.redis_url, tmp_path_factory.mktemp("flood-ban-gateway"),
                               VOXROOM_FRAME_RATE=str(FRAME_RATE), VOXROOM_FRAME_BURST=str(FRAME_BURST),
                               VOXROOM_FLOOD_CLOSE_AFTER=str(FLOOD_CLOSE_AFTER), VOXROOM_FLOOD_BAN_S=str(FLOOD_BAN_S))
    try:
        yield proc, port
    finally:
        proc.stop()


async def _flood(port: int, room: str, forwarded_for: str | None = None) -> tuple[int | None, str]:
    ws = await connect_from(port, room, forwarded_for)
    try:
        await next_json(ws, kind="welcome")
        try:
            for i in range(1000):
                await ws.send(json.dumps({"type": "ping", "t": float(i)}))
        except websockets.ConnectionClosed:
            pass
        return await close_of(ws)
    finally:
        await ws.close()


async def test_a_flooder_is_refused_on_reconnect_until_the_ban_ends(gateway: tuple[Proc, int], room: str) -> None:
    _, port = gateway
    assert await _flood(port, room) == (CloseCode.POLICY_VIOLATION, "flood: too many frames")
    closed_at = time.monotonic()
    ws = await connect(ws_url(port, room))
    try:
        code, reason = await close_of(ws)
    finally:
        await ws.close()
    assert code == CloseCode.POLICY_VIOLATION and reason.startswith("flood: reconnect in"), reason
    # Back in once the ban is over.
    while True:
        ws = await connect(ws_url(port, room))
        try:
            first = await asyncio.wait_for(ws.recv(), 10)
        except websockets.ConnectionClosed:
            first = None
        finally:
            await ws.close()
        if first is not None:
            break
        assert time.monotonic() - closed_at < 60, "still refused long after the ban"
        await asyncio.sleep(0.5)
    assert json.loads(first)["type"] == "welcome"
    async with QueryClient(port, room) as client:
        assert client.got.of("welcome")


async def _admitted(port: int, room: str, forwarded_for: str | None) -> bool | str:
    """True when welcomed; the close reason when refused."""
    ws = await connect_from(port, room, forwarded_for)
    try:
        first = await asyncio.wait_for(ws.recv(), 10)
        return bool(json.loads(first)["type"] == "welcome")
    except websockets.ConnectionClosed:
        return ws.close_reason or ""
    finally:
        await ws.close()


async def test_behind_a_trusted_proxy_the_ban_is_per_forwarded_client(gateway: tuple[Proc, int], room: str) -> None:
    # uvicorn trusts X-Forwarded-For from loopback by default (FORWARDED_ALLOW_IPS), as from nginx
    # on the same host: the ban falls on the client nginx names, not on nginx.
    _, port = gateway
    assert await _flood(port, room, "203.0.113.9") == (CloseCode.POLICY_VIOLATION, "flood: too many frames")
    refused = await _admitted(port, room, "203.0.113.9")
    assert isinstance(refused, str) and refused.startswith("flood: reconnect in"), refused
    assert await _admitted(port, room, "203.0.113.10") is True  # another client behind the same proxy


@pytest.fixture(scope="module")
def untrusting_gateway(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, int]]:
    """A gateway that trusts no proxy here: X-Forwarded-For from us is not believed."""
    proc, port = start_gateway(stack.redis_url, tmp_path_factory.mktemp("flood-ban-untrusting"),
                               VOXROOM_FRAME_RATE=str(FRAME_RATE), VOXROOM_FRAME_BURST=str(FRAME_BURST),
                               VOXROOM_FLOOD_CLOSE_AFTER=str(FLOOD_CLOSE_AFTER), VOXROOM_FLOOD_BAN_S=str(FLOOD_BAN_S),
                               FORWARDED_ALLOW_IPS="192.0.2.1")
    try:
        yield proc, port
    finally:
        proc.stop()


async def test_behind_an_untrusted_proxy_nobody_is_banned_for_one_flooder(
        untrusting_gateway: tuple[Proc, int], room: str) -> None:
    # The address seen is the proxy's, shared by all its clients: banning it would lock them all out.
    proc, port = untrusting_gateway
    assert await _flood(port, room, "203.0.113.9") == (CloseCode.POLICY_VIOLATION, "flood: too many frames")
    assert await _admitted(port, room, "203.0.113.10") is True
    assert "no reconnect ban; set FORWARDED_ALLOW_IPS" in proc.log_text()
