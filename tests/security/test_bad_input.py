"""Bad input over a live server: a real gateway and worker on a real redis-server, real WebSockets.

Every recoverable mistake gets a typed ``error`` and the connection stays; binary garbage closes
with 1003; a bad room id closes with 1008 and a reason; nothing a client sends reaches another
room's keys; and a fuzz run of thousands of hostile frames leaves the gateway serving others.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import random
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import msgpack
import pytest
import redis
import websockets

from tests.conftest import Stack
from tests.support.gauges import wait_connections
from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.ws_clients import QueryClient, close_of, connect, key_snapshot, next_json, refusal, ws_url
from voxroom.store import keys
from voxroom.store.server import RedisServer
from voxroom.wire.protocol import MAX_FRAME_BYTES, MAX_TEXT_CHARS, CloseCode, ErrorCode


async def test_malformed_json_gets_bad_json_and_the_connection_stays(stack: Stack, room: str) -> None:
    async with QueryClient(stack.port, room) as client:
        await client.send_raw('{"type": "say", "seq": 1, "text": "unterminated')
        await client.wait_for(lambda g: bool(g.of("error")), 10)
        assert client.errors()[0]["code"] == ErrorCode.BAD_JSON
        await client.send_raw("[1, 2, 3]")  # JSON, but not an object
        await client.wait_for(lambda g: len(g.of("error")) == 2, 10)
        assert client.errors()[1]["code"] == ErrorCode.BAD_JSON
        # The same connection is still good for a real line, and it is spoken.
        await client.say("Still here.", seq=1)
        ends = await client.wait_ends(1)
        assert client.got.of("accepted")[0]["seq"] == 1
        assert ends[0]["status"] == "ok" and client.got.frames_of(ends[0]["utterance"])
        assert client.closed is None


# Each line: what is sent, the error code expected. Sent one after another on ONE connection, which
# must survive all of them (a ping at the end is answered).
INVALID: list[tuple[str, str]] = [
    (json.dumps({"type": "say", "seq": 1, "text": "x" * (MAX_TEXT_CHARS + 1)}), ErrorCode.TEXT_TOO_LONG),
    (json.dumps({"type": "say", "seq": 2, "text": " \n\t "}), ErrorCode.EMPTY_TEXT),
    (json.dumps({"type": "say", "seq": 3, "text": ""}), ErrorCode.EMPTY_TEXT),
    (json.dumps({"type": "say", "seq": 4, "text": "hi", "voice": "no-such-voice"}), ErrorCode.UNKNOWN_VOICE),
    (json.dumps({"type": "say", "seq": 5, "text": "hi", "voice": "en-joe\n"}), ErrorCode.UNKNOWN_VOICE),
    (json.dumps({"type": "say", "seq": 6, "text": "hi", "voice": keys.room_utterances("b")}), ErrorCode.UNKNOWN_VOICE),
    (json.dumps({"type": "shout", "seq": 7, "text": "hi"}), ErrorCode.UNKNOWN_TYPE),
    (json.dumps({"seq": 8, "text": "hi"}), ErrorCode.BAD_MESSAGE),
    (json.dumps({"type": "say", "seq": "9", "text": "hi"}), ErrorCode.BAD_MESSAGE),
    (json.dumps({"type": "say", "seq": 2**53, "text": "hi"}), ErrorCode.BAD_MESSAGE),
    (json.dumps({"type": "say", "seq": 0, "text": "hi"}), ErrorCode.BAD_MESSAGE),
    (json.dumps({"type": "say", "seq": 10, "text": ["hi"]}), ErrorCode.BAD_MESSAGE),
    (json.dumps({"type": "say", "seq": 12, "text": "nul \x00 inside"}), ErrorCode.BAD_MESSAGE),
    (json.dumps({"type": "resume", "seq": -1, "chunk": 0}), ErrorCode.BAD_MESSAGE),
    ('{"type": "ping", "t": 1' + "0" * 400 + "}", ErrorCode.BAD_MESSAGE),  # too big for a float
    ('{"type": "ping", "t": NaN}', ErrorCode.BAD_MESSAGE),  # would be echoed as invalid JSON
    ("[" * 3000 + "]" * 3000, ErrorCode.BAD_JSON),  # deeper than the decoder recurses
    (json.dumps({"type": "say", "seq": 11, "text": "é" * (MAX_FRAME_BYTES // 2)}), ErrorCode.FRAME_TOO_LARGE),
]


async def test_invalid_messages_get_typed_errors_and_the_connection_stays(stack: Stack, room: str) -> None:
    ws = await connect(ws_url(stack.port, room))
    try:
        await next_json(ws, kind="welcome")
        for data, code in INVALID:
            await ws.send(data)
            reply = await next_json(ws)
            assert reply["type"] == "error" and reply["code"] == code, (data[:80], reply)
        await ws.send(json.dumps({"type": "ping", "t": 1.5}))
        pong = await next_json(ws)
        assert pong["type"] == "pong" and pong["t"] == 1.5
        # None of the refused lines reached the room's log.
        with redis.Redis.from_url(stack.redis_url) as r:
            assert r.xlen(keys.room_utterances(room)) == 0
    finally:
        await ws.close()


async def test_a_frame_over_uvicorns_64_kib_limit_closes_with_1009(stack: Stack, room: str) -> None:
    # Frames between 8 KiB and 64 KiB get frame_too_large (above); past the 64 KiB ws_max_size the
    # gateway's websocket library refuses to read the frame at all and closes with 1009.
    ws = await connect(ws_url(stack.port, room))
    try:
        await next_json(ws, kind="welcome")
        await ws.send("x" * (64 * 1024 + 1))
        code, reason = await close_of(ws)
    finally:
        await ws.close()
    print(f"frame of 64 KiB + 1 byte: closed with {code} {reason!r}")
    assert code == CloseCode.MESSAGE_TOO_BIG


async def test_binary_garbage_closes_with_1003(stack: Stack, room: str) -> None:
    ws = await connect(ws_url(stack.port, room))
    try:
        await next_json(ws, kind="welcome")
        await ws.send(b"\xc1\x00garbage\xff")
        code, reason = await close_of(ws)
    finally:
        await ws.close()
    assert code == CloseCode.UNSUPPORTED_DATA
    assert "msgpack" in reason


async def test_a_msgpack_say_is_accepted_and_spoken(stack: Stack, room: str) -> None:
    async with QueryClient(stack.port, room) as client:
        await client.send_raw(msgpack.packb({"type": "say", "seq": 1, "text": "Packed and sent.", "voice": "en-joe"}))
        ends = await client.wait_ends(1)
        assert client.got.of("accepted") == [{"type": "accepted", "seq": 1, "utterance": 1}]
        assert ends[0]["status"] == "ok" and client.got.frames_of(1)


@pytest.mark.parametrize(("path", "query", "reason"), [
    ("a:b", {}, "bad room id"),
    ("r" * 65, {}, "bad room id"),
    ("%2A", {}, "bad room id"),  # decoded to '*' before routing
    ("abc%0A", {}, "bad room id"),  # a trailing newline: the charset check must anchor at the very end
    ("ok-room", {"client": "a:b"}, "bad client id"),
    ("ok-room", {"client": "x" * 65}, "bad client id"),
    ("ok-room", {"codec": "mp3"}, "codec must be"),
])
async def test_bad_room_and_client_ids_are_refused_with_1008(stack: Stack, path: str, query: dict[str, str],
                                                              reason: str) -> None:
    code, got = await refusal(ws_url(stack.port, path, **query))
    assert code == CloseCode.POLICY_VIOLATION
    assert got.startswith(reason), got


async def test_a_resent_seq_is_not_spoken_twice(stack: Stack, room: str) -> None:
    async with QueryClient(stack.port, room, client="dup-sender") as client:
        await client.say("Only once, please.", seq=1)
        await client.say("Only once, please.", seq=1)
        await client.wait_for(lambda g: bool(g.of("error")), 10)
        assert client.errors()[0]["code"] == ErrorCode.DUPLICATE and client.errors()[0]["seq"] == 1
        await client.wait_ends(1)
    # A reconnect with the same client id cannot get the same seq spoken either.
    async with QueryClient(stack.port, room, client="dup-sender") as again:
        await again.say("Only once, please.", seq=1)
        await again.wait_for(lambda g: bool(g.of("error")), 10)
        assert again.errors()[0]["code"] == ErrorCode.DUPLICATE
        await asyncio.sleep(1.0)  # time enough for a second utterance to start, were there one
        assert again.got.of("start") == [] and again.got.of("accepted") == []
    assert [e["utterance"] for e in client.got.ends()] == [1]
    assert len(client.got.of("start")) == 1
    with redis.Redis.from_url(stack.redis_url) as r:
        assert r.xlen(keys.room_utterances(room)) == 1


def _wait_until_jobs_settle(redis_url: str, timeout: float = 60.0) -> None:
    """Until no utterance is waiting or being played, so that the servers' own writes are done."""
    deadline = time.monotonic() + timeout
    with redis.Redis.from_url(redis_url) as r:
        while time.monotonic() < deadline:
            groups = r.xinfo_groups(keys.JOBS) if r.exists(keys.JOBS) else []
            if all(g["pending"] == 0 and not g.get("lag") for g in groups):
                time.sleep(0.3)
                return
            time.sleep(0.1)
    raise TimeoutError("jobs still pending")


@contextlib.contextmanager
def own_stack(log_dir: Path, *, contexts: int = 1, kill_worker: bool = False,
              **gateway_env: str) -> Iterator[tuple[str, Proc, int]]:
    """A Redis, worker and gateway of one test's own: the Redis URL, the gateway and its port."""
    with RedisServer() as server:
        worker = start_worker(server.url, log_dir, engine="offline", contexts=contexts)
        try:
            # (mypy cannot tell that no VOXROOM_* name is "port" or "insecure".)
            gateway, port = start_gateway(server.url, log_dir, insecure=True, **gateway_env)  # type: ignore[arg-type]
            try:
                yield server.url, gateway, port
            finally:
                gateway.stop()
        finally:
            if kill_worker:
                worker.kill()
            worker.stop()  # (after a kill: closes its log)


@pytest.fixture
def quiet_stack(tmp_path: Path) -> Iterator[tuple[str, int]]:
    """No other test's rooms write keys meanwhile, so every key that changes was changed because of
    what this test sent."""
    with own_stack(tmp_path) as (redis_url, _, port):
        yield redis_url, port


async def test_redis_like_input_writes_only_its_own_rooms_keys(quiet_stack: tuple[str, int], room: str) -> None:
    redis_url, port = quiet_stack
    target = f"{room}-b"
    # Another room, with history, that the hostile client will name.
    async with QueryClient(port, target) as other:
        await other.say("The other room.", seq=1)
        await other.wait_ends(1)
    await asyncio.to_thread(_wait_until_jobs_settle, redis_url)
    before = key_snapshot(redis_url)
    # RESP framing, key names with glob characters, and Lua quoting: all must stay inert data.
    # (Short, because it is spoken in full before the keys are compared.)
    hostile = f"*1\r\n$8\r\nFLUSHALL\r\n {keys.room_pattern('b')} ')--"
    async with QueryClient(port, room, client="attacker") as client:
        await client.say(hostile, seq=1)
        await client.send_json({"type": "say", "seq": 2, "text": "hi", "voice": keys.room_utterances(target)})
        await client.send_json({"type": "say", "seq": 3, "text": "hi", "scene": {"emotion": keys.room_pattern(target)}})
        await client.send_json({"type": "resume", "seq": 2**53 - 1, "chunk": 0})
        await client.wait_ends(1, timeout=60)
        assert client.got.of("start")[0]["text"] == hostile.strip()  # kept verbatim, as data
    await asyncio.to_thread(_wait_until_jobs_settle, redis_url)
    after = key_snapshot(redis_url)
    own = keys.room_prefix(room).encode()
    shared = (b"vx:jobs", b"vx:rooms", b"vx:workers")
    # Worker heartbeats, gateway and worker wake streams and the audio cache (slot = fingerprint mod
    # slots, not chosen by the client) are written by the servers themselves whatever is said.
    server_owned = (b"vx:worker:", b"vx:gw:", b"vx:wake:", b"vx:cache:")
    touched = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    outside = {k for k in touched if not k.startswith(own) and k not in shared and not k.startswith(server_owned)}
    assert outside == set(), f"keys outside room {room} changed: {sorted(outside)[:10]}"
    assert not any(k.startswith(keys.room_prefix("b").encode()) for k in after)
    # The named room exists and was not touched: same keys, same values.
    theirs = keys.room_prefix(target).encode()
    assert {k: v for k, v in after.items() if k.startswith(theirs)} == \
           {k: v for k, v in before.items() if k.startswith(theirs)} != {}
    assert b"vx:jobs" in after


# ---------------------------------------------------------------------------------------------
# Fuzz: thousands of hostile frames from several connections, then a well-behaved client
# ---------------------------------------------------------------------------------------------

FUZZ_SECONDS = 12.0
FUZZ_CONNECTIONS = 4
FUZZ_FRAMES = 5000
FUZZ_SEED = 20261130

_UNICODE_RANGES = [(0x20, 0x7E), (0x00, 0x1F), (0xA0, 0x2FF), (0x590, 0x6FF), (0x200B, 0x202E), (0x4E00, 0x4FFF),
                   (0x1F300, 0x1F64F), (0xFFF0, 0xFFFF), (0x10FFF0, 0x10FFFF)]


def _unicode(rng: random.Random, n: int) -> str:
    out = []
    for _ in range(n):
        lo, hi = rng.choice(_UNICODE_RANGES)
        out.append(chr(rng.randint(lo, hi)))
    return "".join(out)


def _json_value(rng: random.Random, depth: int = 0) -> Any:
    pick = rng.randrange(9 if depth < 3 else 6)
    if pick == 0:
        return None
    if pick == 1:
        return rng.choice([True, False])
    if pick == 2:
        return rng.choice([0, -1, 1, 2**31, 2**53, 2**63, 2**64, -(2**63), 10**30, rng.randint(-10**6, 10**6)])
    if pick == 3:
        return rng.choice([0.5, -1e308, 1e-308, float("inf"), float("nan"), rng.random()])
    if pick in (4, 5):
        return _unicode(rng, rng.randrange(30))
    if pick in (6, 7):
        return {rng.choice(["type", "seq", "text", "voice", "scene", "t", "chunk", _unicode(rng, 4)]):
                _json_value(rng, depth + 1) for _ in range(rng.randrange(5))}
    return [_json_value(rng, depth + 1) for _ in range(rng.randrange(5))]


def _mutated_say(rng: random.Random) -> dict[str, Any]:
    msg: dict[str, Any] = {"type": "say", "seq": rng.randint(1, 50), "text": rng.choice(["Hi.", "Yes.", "Go."])}
    for _ in range(rng.randint(1, 3)):
        field = rng.choice(["type", "seq", "text", "voice", "scene", "extra", "drop"])
        if field == "type":
            msg["type"] = rng.choice(["SAY", "say ", "", None, 1, ["say"], "ping", "resume"])
        elif field == "seq":
            msg["seq"] = rng.choice([-1, 0, "1", 1.5, 2**53, 2**64, 10**30, None, True, [], rng.randint(1, 10**6)])
        elif field == "text":
            msg["text"] = rng.choice([None, 123, "", " ", "x" * (MAX_TEXT_CHARS + rng.randrange(3)),
                                      _unicode(rng, rng.randrange(1, 40)), {"a": 1}])
        elif field == "voice":
            msg["voice"] = rng.choice(["en-joe", "en-espeak", "nope", "", 5, keys.room_utterances("x"),
                                       _unicode(rng, 8)])
        elif field == "scene":
            msg["scene"] = rng.choice([{}, {"emotion": "angry"}, {"Bad Key": "x"}, [], {"a": 5},
                                       {f"k{i}": "v" for i in range(20)}])
        elif field == "extra":
            msg[_unicode(rng, 5)] = _json_value(rng)
        else:
            msg.pop(rng.choice(list(msg) or ["type"]), None)
    return msg


_SURROGATE_PACKER = msgpack.Packer(unicode_errors="surrogatepass")


def _msgpackable(obj: Any) -> bytes | None:
    try:
        return bytes(msgpack.packb(obj))
    except (OverflowError, TypeError, ValueError):
        return None  # an integer past 64 bits: msgpack cannot say it


def _fuzz_frame(rng: random.Random) -> tuple[str, str | bytes]:
    """One hostile frame and the name of its kind."""
    kind = rng.choices(["random_bytes", "random_text", "random_json", "mutated_say", "mutated_say_msgpack",
                        "deep_json", "huge_number", "unicode_say", "msgpack_random", "over_8k", "over_64k", "ping",
                        "invalid_unicode"],
                       weights=[4, 10, 15, 25, 8, 5, 6, 8, 8, 5, 0.3, 6, 8])[0]
    if kind == "random_bytes":
        return kind, rng.randbytes(rng.choice([1, 2, 8, 64, 1000]))
    if kind == "random_text":
        return kind, _unicode(rng, rng.randrange(1, 300))
    if kind == "random_json":
        obj = _json_value(rng) if rng.random() < 0.3 else {
            "type": rng.choice(["say", "ping", "resume", "x"]), "seq": _json_value(rng), "text": _json_value(rng),
            _unicode(rng, 3): _json_value(rng)}
        return kind, json.dumps(obj, ensure_ascii=rng.random() < 0.5)
    if kind == "mutated_say":
        return kind, json.dumps(_mutated_say(rng))
    if kind == "mutated_say_msgpack":
        packed = _msgpackable(_mutated_say(rng))
        return (kind, packed) if packed is not None else ("mutated_say", json.dumps(_mutated_say(rng)))
    if kind == "deep_json":
        n = rng.randint(500, 4000)
        return kind, rng.choice(["[" * n + "]" * n, '{"a":' * n + "1" + "}" * n, "[" * n])
    if kind == "huge_number":
        digits = "9" * rng.choice([20, 309, 400, 4300, 5000])
        return kind, rng.choice([f'{{"type":"ping","t":{digits}}}', f'{{"type":"say","seq":{digits},"text":"hi"}}',
                                 '{"type":"ping","t":1e999}', '{"type":"ping","t":-1e999}',
                                 f'{{"type":"resume","seq":{digits},"chunk":-{digits}}}'])
    if kind == "unicode_say":
        return kind, json.dumps({"type": "say", "seq": rng.randint(1, 10**6),
                                 "text": _unicode(rng, rng.choice([1, 10, MAX_TEXT_CHARS, MAX_TEXT_CHARS + 1]))},
                                ensure_ascii=False)
    if kind == "msgpack_random":
        packed = _msgpackable(_json_value(rng) if rng.random() < 0.3 else
                              {"type": rng.choice(["say", "ping", "resume"]), "seq": _json_value(rng),
                               "text": _json_value(rng), "t": _json_value(rng)})
        return kind, packed if packed is not None else b"\x80"
    if kind == "over_8k":
        return kind, "y" * rng.randint(MAX_FRAME_BYTES + 1, 60_000)
    if kind == "over_64k":
        return kind, "z" * (64 * 1024 + rng.randint(1, 1000))
    if kind == "invalid_unicode":
        # A lone surrogate in some field of a mutated message: JSON writes it as an escape, msgpack
        # as the 3 bytes UTF-8 forbids. Both are bad_message; the connection stays.
        msg = _mutated_say(rng)
        msg[rng.choice(["text", "voice", "type", "note"])] = _unicode(rng, rng.randrange(5)) + chr(
            rng.randint(0xD800, 0xDFFF))
        if rng.random() < 0.5:
            return kind, json.dumps(msg)
        try:
            return kind, bytes(_SURROGATE_PACKER.pack(msg))
        except (OverflowError, TypeError, ValueError):
            return kind, json.dumps(msg)
    return kind, json.dumps({"type": "ping", "t": rng.random()})


class FuzzStats:
    def __init__(self) -> None:
        self.sent: collections.Counter[str] = collections.Counter()
        self.closes: collections.Counter[str] = collections.Counter()
        self.errors: collections.Counter[str] = collections.Counter()
        self.replies: collections.Counter[str] = collections.Counter()
        self.connections = 0
        self.stalls = 0
        self.odd_closes: list[tuple[int | None, str, dict[str, int]]] = []

    def total(self) -> int:
        return sum(self.sent.values())


FUZZ_SYNC_EVERY = 16
"""Every this many frames a connection waits for a pong: the gateway has then really parsed what
was sent (without it the client only fills socket buffers), and a stall would show."""
EXPECTED_CLOSES = {CloseCode.UNSUPPORTED_DATA, CloseCode.MESSAGE_TOO_BIG}
ABNORMAL_CLOSURE = 1006  # RFC 6455: the connection ended without a close frame (never sent on the wire)


async def _sync(ws: websockets.ClientConnection, pongs: dict[float, asyncio.Event], reader: asyncio.Task[None],
                stats: FuzzStats) -> bool:
    """Ping and wait for the pong; False when the connection closed first."""
    t = float(len(pongs)) + 0.25
    pongs[t] = asyncio.Event()
    await ws.send(json.dumps({"type": "ping", "t": t}))
    waiter = asyncio.create_task(pongs[t].wait(), name="fuzz:pong")
    done, _ = await asyncio.wait([waiter, reader], timeout=10, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if not done:
        stats.stalls += 1
    return waiter in done


async def _fuzz_connection(url: str, rng: random.Random, stats: FuzzStats, stop: Callable[[], bool]) -> None:
    """Send hostile frames on one connection after another, reconnecting whenever one is closed."""
    while not stop():
        ws = await connect(url)
        stats.connections += 1
        pongs: dict[float, asyncio.Event] = {}

        async def read(ws: websockets.ClientConnection = ws, pongs: dict[float, asyncio.Event] = pongs) -> None:
            # Drain replies so the gateway's writer never stalls on us, and count them.
            try:
                async for data in ws:
                    if isinstance(data, str):
                        msg = json.loads(data)
                        stats.replies[str(msg.get("type"))] += 1
                        if msg.get("type") == "error":
                            stats.errors[str(msg.get("code"))] += 1
                        elif msg.get("type") == "pong" and msg.get("t") in pongs:
                            pongs[msg["t"]].set()
            except websockets.ConnectionClosed:
                pass

        reader = asyncio.create_task(read(), name="fuzz:reader")
        kinds: collections.Counter[str] = collections.Counter()
        try:
            while not stop():
                kind, frame = _fuzz_frame(rng)
                await ws.send(frame)
                stats.sent[kind] += 1
                kinds[kind] += 1
                if kinds.total() % FUZZ_SYNC_EVERY == 0 and not await _sync(ws, pongs, reader, stats):
                    break
            else:
                await _sync(ws, pongs, reader, stats)  # everything sent was parsed before we leave
        except websockets.ConnectionClosed:
            pass
        finally:
            await ws.close()
            await asyncio.wait_for(reader, 10)
        code = ws.close_code
        stats.closes[str(code)] += 1
        # Our own close when time is up comes back as 1000. Past 64 KiB uvicorn fails the
        # connection with 1009 and drops TCP at once: frames we had already sent behind the big one
        # make the kernel reset the socket, and the 1009 frame is often lost (1006 here).
        expected = code in EXPECTED_CLOSES or (code == CloseCode.NORMAL and stop()) or (
            code == ABNORMAL_CLOSURE and kinds["over_64k"] > 0)
        if not expected:
            stats.odd_closes.append((code, ws.close_reason or "", dict(kinds)))


@pytest.mark.slow
async def test_fuzz_run_leaves_the_gateway_serving_a_well_behaved_client(room: str, tmp_path: Path) -> None:
    # A stack of its own (two contexts, like the shared one), so the fuzz room's accepted lines play
    # on no one else's worker, which is killed at the end rather than left to play them out.
    # The frame rate limit is raised: at the default 30 frames/s most fuzz frames would be refused
    # by the token bucket before reaching the parser this run is after. At most 2 lines may wait
    # per room: 500 random symbols are valid text that speaks for minutes and takes a context
    # ~10 s to synthesize, so a deeper fuzz backlog starves the other room's line for minutes on a
    # small worker (docs/security.md, "Findings"): a capacity question, not the gateway's parser.
    stats = FuzzStats()
    with own_stack(tmp_path, contexts=2, kill_worker=True, VOXROOM_FRAME_RATE="100000",
                   VOXROOM_FRAME_BURST="100000", VOXROOM_MAX_PENDING_PER_ROOM="2") as (_, gateway, port):
        async with QueryClient(port, f"{room}-good") as good:
            started = time.monotonic()

            def stop() -> bool:
                return stats.total() >= FUZZ_FRAMES or time.monotonic() - started > FUZZ_SECONDS

            fuzzers = [asyncio.create_task(
                _fuzz_connection(ws_url(port, f"{room}-fuzz", client=f"fuzz{i}"), random.Random(FUZZ_SEED + i),
                                 stats, stop), name=f"fuzz:{i}") for i in range(FUZZ_CONNECTIONS)]
            await asyncio.gather(*fuzzers)
            elapsed = time.monotonic() - started
            print(f"\nfuzz: seed {FUZZ_SEED}, {stats.total()} frames in {elapsed:.1f} s over "
                  f"{stats.connections} connections ({FUZZ_CONNECTIONS} at a time)")
            print(f"fuzz: sent by kind {dict(sorted(stats.sent.items()))}")
            print(f"fuzz: closes by code {dict(sorted(stats.closes.items()))}")
            print(f"fuzz: errors by code {dict(sorted(stats.errors.items()))}")
            print(f"fuzz: replies by type {dict(sorted(stats.replies.items()))}")
            print(f"fuzz: unexpected closes {stats.odd_closes[:10]}, stalls {stats.stalls}")
            # The well-behaved client, connected all along in another room, is still served.
            await good.say("The storm has passed.", seq=1)
            ends = await good.wait_ends(1, timeout=60)
            assert ends[0]["status"] == "ok" and good.got.frames_of(ends[0]["utterance"])
            assert good.closed is None and good.got.of("error") == []
        # Every connection's cleanup ran, whatever it sent: the gauge is back to zero.
        assert await wait_connections(port, 0) == 0
        assert gateway.alive()
        log = gateway.log_text()
        assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]
        assert stats.total() >= 2000
        # The gateway closed connections only for the reasons it documents: binary garbage (1003)
        # and frames past uvicorn's 64 KiB limit (1009); our own end-of-run closes read 1000.
        assert stats.odd_closes == [], stats.odd_closes
        assert stats.stalls == 0
        assert stats.errors[ErrorCode.INTERNAL] == 0
