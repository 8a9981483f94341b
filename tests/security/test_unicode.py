"""Strings that cannot be encoded (lone surrogates), over a live gateway: refused at the edge.

JSON's ``"\\ud800"`` decodes to a Python str that cannot be encoded as UTF-8. Once, such a ``say``
hung its socket and leaked its slot (25 of them locked a 25-slot gateway out), a ``scene`` value
dropped the socket with 1006 and a traceback, and ``POST /v1/voices/search`` answered 500. Now every
string field of every message (and of every HTTP body) is checked where it enters: ``bad_message``
on the socket, which stays open, or 400.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Iterator
from typing import Any

import httpx
import msgpack
import pytest
import websockets

from tests.conftest import Stack
from tests.support.gauges import wait_connections
from tests.support.processes import Proc, start_gateway
from tests.support.ws_clients import QueryClient, close_of, connect, next_json, ws_url
from voxroom.runtime import client_faults_log
from voxroom.wire.protocol import CloseCode, ErrorCode

MAX_CONNECTIONS = 25
PACK_SURROGATES = msgpack.Packer(unicode_errors="surrogatepass")
"""Writes a surrogate as the 3 bytes UTF-8 forbids (ED A0 80), as a hostile msgpack client can."""


@pytest.fixture(scope="module")
def gateway(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, int]]:
    """A gateway of this module's own (its connection gauge counts only these tests' sockets), as
    small as the gateway the issue locked out, on the session's Redis and worker."""
    proc, port = start_gateway(stack.redis_url, tmp_path_factory.mktemp("unicode-gateway"),
                               VOXROOM_MAX_CONNECTIONS=str(MAX_CONNECTIONS), VOXROOM_FRAME_RATE="1000",
                               VOXROOM_FRAME_BURST="1000")
    try:
        yield proc, port
    finally:
        proc.stop()


def _json(obj: dict[str, Any]) -> str:
    return json.dumps(obj)  # ensure_ascii: a surrogate goes out as the escape "\ud800", as an attacker writes it


CASES: list[tuple[str, str | bytes]] = [
    ("say text", _json({"type": "say", "seq": 1, "text": "\ud800"})),
    ("say text, inside", _json({"type": "say", "seq": 2, "text": "Hello \udfff world"})),
    ("say text, pair reversed", _json({"type": "say", "seq": 3, "text": "\ude00\ud83d"})),
    ("scene value", _json({"type": "say", "seq": 4, "text": "Hi.", "scene": {"emotion": "\ud800"}})),
    ("scene key", _json({"type": "say", "seq": 5, "text": "Hi.", "scene": {"\ud800": "angry"}})),
    ("voice", _json({"type": "say", "seq": 6, "text": "Hi.", "voice": "en-joe\udc80"})),
    ("unknown say field", _json({"type": "say", "seq": 7, "text": "Hi.", "note": ["\ud800"]})),
    ("ping field", _json({"type": "ping", "t": 1.0, "\udbff": 1})),
    ("resume field", _json({"type": "resume", "seq": 0, "chunk": 0, "x": {"y": "\ud800"}})),
    ("type", _json({"type": "say\ud800", "seq": 8, "text": "Hi."})),
    ("msgpack say text", PACK_SURROGATES.pack({"type": "say", "seq": 9, "text": "\ud800"})),
    ("msgpack scene value", PACK_SURROGATES.pack({"type": "say", "seq": 10, "text": "Hi.",
                                                  "scene": {"emotion": "\udfff"}})),
]


async def _pong(ws: websockets.ClientConnection, t: float) -> None:
    await ws.send(json.dumps({"type": "ping", "t": t}))
    reply = await next_json(ws, kind=("pong", "error"))
    assert reply == {"type": "pong", "t": t, "server_ms": reply["server_ms"]}, reply


async def test_a_lone_surrogate_in_any_field_is_bad_message_and_the_socket_stays(
        gateway: tuple[Proc, int], room: str) -> None:
    proc, port = gateway
    async with QueryClient(port, room, client="speaker") as client:
        assert client.ws is not None
        for i, (what, frame) in enumerate(CASES):
            await client.send_raw(frame)
            await client.wait_for(lambda g, n=i + 1: len(g.of("error")) >= n, 10)
            error = client.errors()[i]
            assert error["code"] == ErrorCode.BAD_MESSAGE, (what, error)
            await client.send_json({"type": "ping", "t": float(i)})
            await client.wait_for(lambda g, n=i + 1: len(g.of("pong")) >= n, 10)
        # The same socket still speaks, and only the good line reached the room.
        await client.say("Still speaking.", seq=11)
        ends = await client.wait_ends(1, timeout=60)
        assert ends[0]["status"] == "ok" and client.got.frames_of(ends[0]["utterance"])
        assert [s["text"] for s in client.got.of("start")] == ["Still speaking."]
        assert client.closed is None
    assert await wait_connections(port, 0) == 0
    log = proc.log_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]


async def test_surrogate_says_repeated_past_the_connection_limit_leak_no_slot(gateway: tuple[Proc, int],
                                                                              room: str) -> None:
    # The lock-out: connect, say "\ud800", leave, as many times as the gateway has slots.
    _, port = gateway
    for i in range(MAX_CONNECTIONS + 5):
        ws = await connect(ws_url(port, room))
        try:
            await next_json(ws, kind="welcome")
            await ws.send(_json({"type": "say", "seq": i + 1, "text": "\ud800"}))
            reply = await next_json(ws, kind=("error", "accepted"))
            assert reply["code"] == ErrorCode.BAD_MESSAGE, reply
        finally:
            await ws.close()
    assert await wait_connections(port, 0) == 0
    async with QueryClient(port, room) as client:  # not 1013 "gateway full"
        assert client.got.of("welcome")


# --- fuzz: every message type, invalid Unicode everywhere, over JSON and msgpack ---------------

FUZZ_SEED = 20261131
FUZZ_CONNECTIONS = 6
FUZZ_ROUNDS = 3
FUZZ_FRAMES = 30
BAD_STRINGS = ["\ud800", "\udfff", "\udc00\ud800", "a\ud83d", "\ude00b", "x" * 40 + "\udbff"]


def _bad(rng: random.Random) -> str:
    s = rng.choice(BAD_STRINGS)
    return rng.choice(["", "Hello ", "é"]) + s + rng.choice(["", " there", "😀"])


def _fuzz_message(rng: random.Random) -> dict[str, Any]:
    kind = rng.choice(["say", "ping", "resume", "other"])
    base: dict[str, Any] = {
        "say": {"type": "say", "seq": rng.randint(1, 1000), "text": "Hi."},
        "ping": {"type": "ping", "t": 1.0},
        "resume": {"type": "resume", "seq": 0, "chunk": 0},
        "other": {"type": rng.choice(["shout", "welcome", "error"])},
    }[kind]
    where = rng.choice(["type", "text", "voice", "scene_value", "scene_key", "extra_key", "extra_value", "nested"])
    bad = _bad(rng)
    if where == "type":
        base["type"] = base["type"] + bad
    elif where == "text":
        base["text"] = bad
    elif where == "voice":
        base["voice"] = bad
    elif where == "scene_value":
        base["scene"] = {"emotion": "calm", rng.choice(["language", "gender"]): bad}
    elif where == "scene_key":
        base["scene"] = {bad: "calm"}
    elif where == "extra_key":
        base[bad] = rng.choice([1, "x", None])
    elif where == "extra_value":
        base["note"] = bad
    else:
        base["note"] = [1, {"deep": [None, bad]}]
    return base


async def _fuzz_client(port: int, room: str, rng: random.Random, errors: list[str]) -> None:
    for _ in range(FUZZ_ROUNDS):
        ws = await connect(ws_url(port, room))
        try:
            await next_json(ws, kind="welcome")
            for i in range(FUZZ_FRAMES):
                msg = _fuzz_message(rng)
                await ws.send(PACK_SURROGATES.pack(msg) if rng.random() < 0.4 else _json(msg))
                reply = await next_json(ws, kind=("error", "accepted", "pong"))
                errors.append(str(reply.get("code", reply["type"])))
                if i % 8 == 7:
                    await _pong(ws, float(i))
            await _pong(ws, -1.0)  # the connection survived all of it
        finally:
            await ws.close()
        assert ws.close_code == CloseCode.NORMAL  # our close, not the server's


async def test_fuzz_invalid_unicode_in_every_message_type_then_the_gauge_returns_to_zero(
        gateway: tuple[Proc, int], room: str) -> None:
    proc, port = gateway
    errors: list[str] = []
    await asyncio.gather(*(_fuzz_client(port, f"{room}-{i}", random.Random(FUZZ_SEED + i), errors)
                           for i in range(FUZZ_CONNECTIONS)))
    print(f"\nunicode fuzz: {len(errors)} frames, replies {sorted(set(errors))}")
    assert len(errors) == FUZZ_CONNECTIONS * FUZZ_ROUNDS * FUZZ_FRAMES
    assert set(errors) == {ErrorCode.BAD_MESSAGE}
    assert await wait_connections(port, 0) == 0
    assert proc.alive()
    log = proc.log_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]


# --- the same over HTTP ---------------------------------------------------------------------------

HTTP_CASES = [
    ("/v1/voices/search", {"scene": {"emotion": "\ud800"}}),
    ("/v1/voices/search", {"scene": {"\ud800": "angry"}}),
    ("/v1/voices/search", {"scene": {"emotion": "calm"}, "k": 3, "note": "\udfff"}),
    ("/v1/audio/speech", {"input": "\ud800"}),
    ("/v1/audio/speech", {"input": "Hello \udfff there."}),
    ("/v1/audio/speech", {"input": "Hi.", "voice": "alloy\ud800"}),
    ("/v1/audio/speech", {"input": "Hi.", "model": "tts-1\udc00"}),
    ("/v1/audio/speech", {"input": "Hi.", "response_format": "wav\ud800"}),
    ("/v1/audio/speech", {"input": "Hi.", "scene": {"emotion": "\ud800"}}),
]


@pytest.mark.parametrize(("path", "body"), HTTP_CASES)
async def test_a_lone_surrogate_in_an_http_body_is_400(gateway: tuple[Proc, int], path: str,
                                                       body: dict[str, Any]) -> None:
    proc, port = gateway
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        resp = await http.post(path, content=_json(body), headers={"content-type": "application/json"})
    assert resp.status_code == 400, resp.text[:300]
    assert resp.json()["error"]["code"] == ErrorCode.BAD_MESSAGE
    log = proc.log_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]


async def test_invalid_utf8_in_query_parameters_is_never_a_500(gateway: tuple[Proc, int], room: str) -> None:
    # %ED%A0%80 is a surrogate's UTF-8 form: Starlette decodes it to U+FFFD, never to a surrogate.
    _, port = gateway
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=30) as http:
        resp = await http.get("/v1/voices?gender=%ED%A0%80&%ED%A0%80=x")
    assert resp.status_code == 200 and resp.json()["voices"] == []
    ws = await connect(f"ws://127.0.0.1:{port}/rooms/{room}/ws?client=%ED%A0%80")
    try:
        code, reason = await close_of(ws)
    finally:
        await ws.close()
    assert (code, reason) == (CloseCode.POLICY_VIOLATION, "bad client id")


# --- text frames whose bytes are not UTF-8 at all --------------------------------------------------

# What a hostile client can put in a text frame that a browser never sends: a surrogate in CESU
# form, a byte no UTF-8 holds, a sequence cut in half, an overlong "/".
NOT_UTF8 = [
    b'{"type":"say","seq":1,"text":"\xed\xa0\x80"}',
    b'{"type":"ping","t":1.0}\xff',
    b'{"type":"say","seq":2,"text":"caf\xc3"}',
    b'{"type":"say","seq":3,"text":"\xc0\xaf"}',
]


async def test_a_text_frame_that_is_not_utf8_closes_1007_with_one_warning_and_the_room_plays_on(
        gateway: tuple[Proc, int], room: str) -> None:
    # RFC 6455 (8.1) makes the server fail such a connection: 1007, not bad_message. What must
    # hold: the close says why, no slot leaks (more tries than the gateway has slots), the room's
    # other clients lose nothing, and the log gets a warning line, not an ERROR traceback per frame.
    proc, port = gateway
    async with QueryClient(port, room, client="narrator") as speaker:
        await speaker.say("Before the noise.", seq=1)
        tries = MAX_CONNECTIONS + 5
        for i in range(tries):
            ws = await connect(ws_url(port, room))
            try:
                await next_json(ws, kind="welcome")
                await ws.send(NOT_UTF8[i % len(NOT_UTF8)], text=True)
                code, _ = await close_of(ws)
            finally:
                await ws.close()
            assert code == CloseCode.INVALID_DATA, (i, code)
        await speaker.say("After the noise.", seq=2)
        ends = await speaker.wait_ends(2, timeout=60)
        assert [e["status"] for e in ends] == ["ok", "ok"]
        assert [s["text"] for s in speaker.got.of("start")] == ["Before the noise.", "After the noise."]
        assert all(speaker.got.frames_of(e["utterance"]) for e in ends)
        assert speaker.closed is None
    assert await wait_connections(port, 0) == 0
    log = proc.log_text()
    assert "Traceback" not in log and "Invalid UTF-8 sequence" not in log, log[-3000:]
    assert log.count(client_faults_log.REWRITTEN) == tries, log[-3000:]
