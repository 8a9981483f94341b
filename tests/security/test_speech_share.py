"""One client cannot hold every ``POST /v1/audio/speech`` slot: a share per token subject and per
client address (503 with ``Retry-After`` past it), and a response whose client reads nothing is
let go after ``VOXROOM_SEND_STALL_CLOSE_S``, its slot freed. Over a real gateway, worker and Redis."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx

from app.api.speech_room import StreamSlots
from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.raw_http import RawStream, post
from voxroom.store.server import RedisServer
from voxroom.wire import tokens
from voxroom.wire.protocol import ROOM_RATE

SECRET = "s" * 40
SPEECH = "/v1/audio/speech"
BODY = {"input": " ".join(["The lantern swung once in the wind, and nobody in the village slept."] * 28),
        "voice": "en-joe", "response_format": "pcm"}
"""About two minutes of audio: megabytes, far more than a client's socket buffers hold."""


def as_client(subject: str, address: str) -> dict[str, str]:
    """A caller with its own token subject, behind a proxy on this host that uvicorn trusts."""
    return {"Authorization": "Bearer " + tokens.mint(SECRET, "_api", "speaker", subject=subject),
            "X-Forwarded-For": address}


async def metric(port: int, pattern: str) -> float:
    async with httpx.AsyncClient(timeout=10) as http:
        text = (await http.get(f"http://127.0.0.1:{port}/metrics")).text
    found = re.search(rf"^{pattern} (\S+)$", text, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


def test_the_share_is_counted_per_owner_and_given_back() -> None:
    slots = StreamSlots(limit=3, per_client=2)
    assert slots.reserve(["sub:a", "addr:1"]) == "ok"
    assert slots.reserve(["sub:a", "addr:2"]) == "ok"
    assert slots.reserve(["sub:a", "addr:3"]) == "share", "the subject holds two"
    assert slots.reserve(["sub:b", "addr:1"]) == "ok"
    assert slots.reserve(["sub:c", "addr:4"]) == "full"
    slots.release(["sub:a", "addr:1"])
    assert slots.reserve(["sub:a", "addr:3"]) == "ok"
    for owners in (["sub:a", "addr:2"], ["sub:b", "addr:1"], ["sub:a", "addr:3"]):
        slots.release(owners)
    assert slots.active == 0 and len(slots.held) == 0, "nothing left behind"
    assert StreamSlots(limit=3).reserve(["sub:a"] * 5) == "ok", "no share: only the gateway's limit"


def speech_stack(tmp_path: Path, server: RedisServer, *, stall_s: int, **env: str) -> tuple[Proc, Proc, int]:
    """A worker and a gateway of 3 speech slots whose stalled responses are cut after ``stall_s``:
    the requests each test expects refused must come within it of the stalled ones filling their
    sockets, so it is seconds wider than that takes on a busy machine."""
    worker = start_worker(server.url, tmp_path, engine="synthetic", contexts=2, VOXROOM_SYNTHETIC_RTF="0.01")
    gateway, port = start_gateway(server.url, tmp_path, insecure=False, VOXROOM_JWT_SECRET=SECRET,
                                  VOXROOM_SPEECH_MAX_STREAMS="3", VOXROOM_SEND_STALL_CLOSE_S=str(stall_s), **env)
    return worker, gateway, port


async def wait_streams(port: int, expected: int, timeout: float = 30.0) -> float:
    deadline = time.monotonic() + timeout
    while True:
        value = await metric(port, "voxroom_speech_streams")
        if value == expected or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.2)


async def test_one_client_gets_its_share_of_the_slots_and_no_more(tmp_path: Path) -> None:
    """Two non-reading requests of one subject from one address hold its share (2 of 3 slots): a
    third of that subject from another address, and one of another subject from that address, get
    503 with ``Retry-After``; a fair caller gets the last slot and its whole body. Before, the greedy
    caller took the third slot too, and the fair one got 503."""
    with RedisServer() as server:
        worker, gateway, port = speech_stack(tmp_path, server, stall_s=10, VOXROOM_SPEECH_MAX_STREAMS_PER_CLIENT="2")
        greedy = [RawStream(port, SPEECH, BODY, headers=as_client("greedy", "10.0.0.1")) for _ in range(2)]
        try:
            for stream in greedy:  # they read nothing past the status line
                assert (await stream.start()).status == 200
            for who, address in (("greedy", "10.0.0.3"), ("neighbour", "10.0.0.1")):
                refused = await post(port, SPEECH, BODY, headers=as_client(who, address))
                assert refused.status == 503, (who, refused.status)
                assert int(refused.headers["retry-after"]) >= 1
                error = refused.json()["error"]  # type: ignore[index]
                assert error["code"] == "client_busy" and error["type"] == "server_error", error
            fair = await post(port, SPEECH, BODY, headers=as_client("fair", "10.0.0.9"))
            assert fair.status == 200 and fair.complete and len(fair.body) > 60 * ROOM_RATE * 2
            assert await wait_streams(port, 0, timeout=60) == 0, "the stalled ones are let go too (next test)"
            again = await post(port, SPEECH, {**BODY, "input": "Back again."}, headers=as_client("greedy", "10.0.0.1"))
            assert again.status == 200 and again.complete, "the share is given back with the slots"
        finally:
            for stream in greedy:
                await stream.close()
            gateway.stop()
            worker.stop()


async def test_responses_whose_clients_read_nothing_are_let_go_and_their_slots_freed(tmp_path: Path) -> None:
    """Three clients (three subjects, three addresses) hold every slot and read nothing past the
    status line: a fourth gets 503 at first; after the stall limit (5 s here) the three are aborted
    (what they got ends without its terminating chunk) and the fourth is served. Before, they held
    the slots for as long as they kept their sockets."""
    stall_s = 5
    with RedisServer() as server:
        worker, gateway, port = speech_stack(tmp_path, server, stall_s=stall_s)
        stalled = [RawStream(port, SPEECH, BODY, headers=as_client(f"idle{i}", f"10.0.1.{i}")) for i in range(3)]
        fair_client = as_client("fair", "10.0.0.9")
        try:
            started = time.monotonic()
            for stream in stalled:
                assert (await stream.start()).status == 200
            first = await post(port, SPEECH, BODY, headers=fair_client)
            assert first.status == 503 and first.json()["error"]["code"] == "busy"  # type: ignore[index]
            for _ in range(150):
                fair = await post(port, SPEECH, BODY, headers=fair_client)
                if fair.status != 503:
                    break
                await asyncio.sleep(0.2)
            assert fair.status == 200 and fair.complete, fair.status
            assert time.monotonic() - started >= stall_s, "never before the stall limit"
            # The fair one needed one slot: the other stalled ones may be cut a moment after it.
            for stream in stalled:  # what the kernel held, then the end of the connection
                cut = await stream.read_body(timeout=30)
                assert not cut.complete and cut.ended in ("eof", "reset"), cut.ended
                assert len(cut.body) < len(fair.body)
            # Each was counted and logged before its connection was aborted (app/api/speech_stream.py).
            assert await metric(port, 'voxroom_speech_cut_total{reason="stalled"}') == 3
            assert gateway.log_text().count(f"the client read nothing for {stall_s} s") == 3
            assert await wait_streams(port, 0) == 0
        finally:
            for stream in stalled:
                await stream.close()
            gateway.stop()
            worker.stop()
