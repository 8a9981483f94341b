"""Client identity without a token ``sub`` (the ``voxroom token`` default), over a live gateway with
auth on: nobody can speak as a live connection, nor as a generated id, nor jump a sender's ``seq``.

Once, server-generated ids and self-chosen ones shared the ``c-`` namespace and ``start.sender``
broadcast them: an attacker joined with the victim's id, sent ``seq`` 2**53-1, and its line was
attributed to the victim while every later line of the victim was refused as ``duplicate``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import Stack
from tests.support.processes import start_gateway
from tests.support.stores import Stores
from tests.support.ws_clients import QueryClient, close_of, connect, next_json, refusal, ws_url
from voxroom.store import keys
from voxroom.wire import tokens
from voxroom.wire.protocol import MAX_SAY_SEQ, CloseCode, ErrorCode

SECRET = "identity-test-secret-0123456789abcdef"


@pytest.fixture(scope="module")
def gateways(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """Two gateways with auth on, on the session's Redis and worker: a claim holds across gateways."""
    logs = tmp_path_factory.mktemp("identity-gateways")
    first, port_a = start_gateway(stack.redis_url, logs, insecure=False, VOXROOM_JWT_SECRET=SECRET)
    try:
        second, port_b = start_gateway(stack.redis_url, logs, insecure=False, VOXROOM_JWT_SECRET=SECRET)
        try:
            yield port_a, port_b
        finally:
            second.stop()
    finally:
        first.stop()


def token(room: str) -> str:
    return tokens.mint(SECRET, room, "speaker")  # no subject: what `voxroom token` mints by default


async def test_a_live_self_chosen_id_cannot_be_taken_and_the_victim_keeps_speaking(
        gateways: tuple[int, int], stack: Stack, room: str) -> None:
    port_a, port_b = gateways
    async with QueryClient(port_a, room, token=token(room), client="alice") as victim:
        assert victim.got.of("welcome")[0]["client"] == "c-alice"
        await victim.say("First line from Alice.", seq=1)
        await victim.wait_for(lambda g: bool(g.of("accepted")), 10)
        claim = keys.room_client_claim(room, "c-alice")
        with redis.Redis.from_url(stack.redis_url) as r:
            ttl = r.ttl(claim)
        assert 0 < ttl <= 15  # the claim has an owner that expires it
        # The takeover, through this gateway and through another: refused before any message.
        for port in (port_a, port_b):
            code, reason = await refusal(ws_url(port, room, token=token(room), client="alice"))
            assert (code, reason) == (CloseCode.TRY_AGAIN_LATER, "client id in use; retry later")
        # An attacker under its own name cannot jump its seq out of range either.
        async with QueryClient(port_b, room, token=token(room), client="mallory") as attacker:
            for seq in (2**53 - 1, MAX_SAY_SEQ + 1):
                await attacker.send_json({"type": "say", "seq": seq, "text": "Alice said this."})
            await attacker.wait_for(lambda g: len(g.of("error")) == 2, 10)
            assert [e["code"] for e in attacker.errors()] == [ErrorCode.BAD_MESSAGE] * 2
        # The victim keeps speaking, under its own name, and nobody else's line carries it.
        await victim.say("Second line from Alice.", seq=2)
        await victim.wait_for(lambda g: sum(s["text"] == "Second line from Alice." for s in g.of("start")) == 1, 60)
        assert [a["seq"] for a in victim.got.of("accepted")] == [1, 2]
        assert victim.errors() == []
        assert [(s["sender"], s["text"]) for s in victim.got.of("start")] == [
            ("c-alice", "First line from Alice."), ("c-alice", "Second line from Alice.")]
    # Alice gone, her claim goes with her: she (or anyone holding her name) may come back, and
    # the dedupe still knows her lines.
    with redis.Redis.from_url(stack.redis_url) as r:
        for _ in range(100):
            if not r.exists(claim):
                break
            await asyncio.sleep(0.1)
        assert not r.exists(claim)
    async with QueryClient(port_b, room, token=token(room), client="alice") as back:
        await back.say("First line from Alice.", seq=1)
        await back.wait_for(lambda g: bool(g.of("error")), 10)
        assert back.errors()[0]["code"] == ErrorCode.DUPLICATE


async def test_a_generated_id_cannot_be_chosen(gateways: tuple[int, int], room: str) -> None:
    port_a, _ = gateways
    ws = await connect(ws_url(port_a, room, token=token(room)))
    try:
        generated = (await next_json(ws, kind="welcome"))["client"]
    finally:
        await ws.close()
    assert generated.startswith(tokens.GENERATED_PREFIX)
    for chosen in (generated, "g-anything"):
        code, reason = await refusal(ws_url(port_a, room, token=token(room), client=chosen))
        assert (code, reason) == (CloseCode.POLICY_VIOLATION, "bad client id")
    # And a chosen name never comes out in the generated namespace, nor a generated one in the chosen.
    ws = await connect(ws_url(port_a, room, token=token(room), client="bob"))
    try:
        assert (await next_json(ws, kind="welcome"))["client"] == "c-bob"
    finally:
        await ws.close()
    assert not generated.startswith(tokens.SELF_CHOSEN_PREFIX)


async def test_a_token_subject_in_a_reserved_namespace_is_refused(gateways: tuple[int, int], room: str) -> None:
    import jwt

    port_a, _ = gateways
    for sub in ("g-0123456789abcdef", "c-alice", "\ud800"):
        forged = jwt.encode({"room": room, "role": "speaker", "exp": 2**40, "sub": sub}, SECRET, algorithm="HS256")
        ws = await connect(ws_url(port_a, room, token=forged))
        try:
            code, reason = await close_of(ws)
        finally:
            await ws.close()
        assert code == CloseCode.POLICY_VIOLATION, (sub, reason)
        assert reason.startswith(("token subject may not start", "bad client id")), reason


async def test_claims_are_refreshed_recovered_after_a_flush_and_released_only_by_their_owner(
        redis_url: str, room: str, stores: Stores) -> None:
    from redis.asyncio import Redis

    from app.room.identity import ClientClaims

    client = Redis.from_url(redis_url, decode_responses=True)
    try:
        store = await stores.open(redis_url)
        mine = ClientClaims(store.commands(), store.slot_of, "gw-a", ttl_s=5.0)
        theirs = ClientClaims(store.commands(), store.slot_of, "gw-b", ttl_s=5.0)
        owner = await mine.claim(room, "c-alice")
        assert owner is not None and await theirs.claim(room, "c-alice", wait_s=0.0) is None
        key = keys.room_client_claim(room, "c-alice")
        await client.pexpire(key, 1000)
        assert await mine.refresh() == 0
        assert await client.pttl(key) > 1000  # extended back to the full TTL
        await client.delete(key)  # as after a Redis restart with nothing saved
        assert await mine.refresh() == 0
        assert await client.get(key) == owner  # taken again by its live owner
        await theirs.release(room, "c-alice", "gw-b:1")  # not its claim: nothing happens
        assert await client.get(key) == owner
        await client.set(key, "gw-b:9")  # ours expired while Redis was away, and someone took it
        assert await mine.refresh() == 1 and await client.get(key) == "gw-b:9"  # theirs now, not stolen back
        await client.delete(key)
        owner = await mine.claim(room, "c-alice")
        assert owner is not None
        await mine.release(room, "c-alice", owner)
        assert not await client.exists(key) and len(mine) == 0
        assert await mine.claim(room, "c-bob") and await mine.claim(room, "c-eve")
        await mine.release_all()
        assert not await client.exists(keys.room_client_claim(room, "c-bob"), keys.room_client_claim(room, "c-eve"))
        await mine.aclose()
        await theirs.aclose()
    finally:
        await client.aclose()


async def test_a_gateway_that_stops_gives_its_claims_back_at_once(stack: Stack, room: str,
                                                                  tmp_path_factory: pytest.TempPathFactory) -> None:
    # Its clients reconnect elsewhere at once (1012), with the same ids: they must not wait for a TTL.
    gateway, port = start_gateway(stack.redis_url, tmp_path_factory.mktemp("identity-stopping"))
    claim = keys.room_client_claim(room, "carol")
    try:
        ws = await connect(ws_url(port, room, client="carol"))
        await next_json(ws, kind="welcome")
        with redis.Redis.from_url(stack.redis_url) as r:
            assert r.exists(claim)
        await asyncio.to_thread(gateway.stop)
        assert (await close_of(ws))[0] == CloseCode.SERVICE_RESTART
        await ws.close()
    finally:
        gateway.stop()
    with redis.Redis.from_url(stack.redis_url) as r:
        assert not r.exists(claim)


async def test_the_claim_secret_takes_the_id_back_after_its_gateway_died(
        stack: Stack, room: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    """A gateway killed with its clients leaves their claims behind (up to CLAIM_TTL_S). A client
    that reconnects elsewhere with the secret its welcome gave it (``?claim=``) gets its id back at
    once; without the secret the id stays refused, and a wrong secret is no better."""
    logs = tmp_path_factory.mktemp("identity-reclaim")
    doomed, port_a = start_gateway(stack.redis_url, logs, insecure=False, VOXROOM_JWT_SECRET=SECRET)
    other, port_b = start_gateway(stack.redis_url, logs, insecure=False, VOXROOM_JWT_SECRET=SECRET)
    try:
        ws = await connect(ws_url(port_a, room, token=token(room), client="bob"))
        welcome = await next_json(ws, kind="welcome")
        secret = welcome["claim"]
        assert welcome["client"] == "c-bob" and len(secret) >= 16
        doomed.kill()  # SIGKILL: the claim stays in Redis, nobody releases it
        with redis.Redis.from_url(stack.redis_url) as r:
            assert r.exists(keys.room_client_claim(room, "c-bob"))
        code, reason = await refusal(ws_url(port_b, room, token=token(room), client="bob"))
        assert (code, reason) == (CloseCode.TRY_AGAIN_LATER, "client id in use; retry later")
        code, _ = await refusal(ws_url(port_b, room, token=token(room), client="bob", claim="x" * 24))
        assert code == CloseCode.TRY_AGAIN_LATER
        async with QueryClient(port_b, room, token=token(room), client="bob", claim=secret) as back:
            again = back.got.of("welcome")[0]
            assert again["client"] == "c-bob" and again["claim"] == secret
            await back.say("Bob is back.", seq=1)
            await back.wait_for(lambda g: bool(g.of("accepted")), 10)
            # Whoever lacks the secret is still refused while Bob is here.
            code, _ = await refusal(ws_url(port_b, room, token=token(room), client="bob"))
            assert code == CloseCode.TRY_AGAIN_LATER
        code, reason = await refusal(ws_url(port_b, room, token=token(room), claim=secret))
        assert code == CloseCode.POLICY_VIOLATION and reason.startswith("bad claim")
    finally:
        other.stop()
        doomed.stop()
