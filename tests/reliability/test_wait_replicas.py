"""``VOXROOM_REDIS_WAIT_REPLICAS``: ``accepted`` only once a replica has the line (``WAIT``).

A real primary and a real replica (``redis-server``, ``REPLICAOF``), a real worker and real gateway
processes. The replica is paused with SIGSTOP to make ``WAIT`` time out: the say is answered
``unavailable``, the line is in the primary, and the resend of the same seq after SIGCONT is
answered ``duplicate``; the room hears every line once, in order. With the setting at 0 a paused
replica changes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.room_client import RoomClient
from tests.support.stores import Stores
from voxroom.errors import NotReplicated
from voxroom.store import clients as redis_client
from voxroom.store import keys
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.replicas import check_wait
from voxroom.store.server import RedisServer

VOICE = "en-espeak"
WAIT_TIMEOUT_MS = 4000  # a paused replica in part 2 must be resumed within it (the gateway allows < 5 s)


class Replicated:
    """A primary and one replica of it, both ``redis-server`` processes of their own."""

    def __init__(self, primary: RedisServer, replica: RedisServer) -> None:
        self.primary = primary
        self.replica = replica

    def replica_pid(self) -> int:
        assert self.replica.process is not None
        return self.replica.process.pid

    @contextlib.contextmanager
    def replica_paused(self) -> Iterator[None]:
        """The replica SIGSTOPped (it neither reads the replication stream nor acknowledges it),
        always SIGCONTed after."""
        os.kill(self.replica_pid(), signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.replica_pid(), signal.SIGCONT)


def start_replica_of(primary: RedisServer, replica: RedisServer, timeout_s: float = 20.0) -> None:
    admin = redis.Redis(port=replica.port, decode_responses=True)
    try:
        admin.execute_command("REPLICAOF", "127.0.0.1", primary.port)  # type: ignore[no-untyped-call]
        deadline = time.monotonic() + timeout_s
        while admin.info("replication").get("master_link_status") != "up":
            if time.monotonic() > deadline:
                raise TimeoutError(f"replica on {replica.port} did not sync with {primary.port}")
            time.sleep(0.05)
    finally:
        admin.close()


@pytest.fixture(scope="module")
def replicated() -> Iterator[Replicated]:
    with RedisServer() as primary, RedisServer() as replica:
        start_replica_of(primary, replica)
        yield Replicated(primary, replica)


@pytest.fixture(scope="module")
def worker(replicated: Replicated, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Proc]:
    proc = start_worker(replicated.primary.url, tmp_path_factory.mktemp("wait-worker"))
    yield proc
    proc.stop()


def _utt(client: redis.Redis, room: str) -> list[dict[str, str]]:
    entries: Any = client.xrange(keys.room_utterances(room))
    return [fields for _id, fields in entries]


def _answer(client: RoomClient, seq: int) -> dict[str, Any] | None:
    """The first ``accepted`` or ``error`` the client got for ``seq`` since it last sent it."""
    for message in client.got.messages:
        if message.get("type") in ("accepted", "error") and message.get("seq") == seq:
            return message
    return None


async def _say(client: RoomClient, text: str, seq: int, timeout_s: float = 15.0) -> dict[str, Any]:
    """Send ``seq`` and return the answer it got (earlier answers to the same seq forgotten)."""
    client.got.messages = [m for m in client.got.messages if m.get("seq") != seq or m.get("type") not in
                           ("accepted", "error")]
    await client.say(text, voice=VOICE, seq=seq)
    await client.wait_for(lambda g: _answer(client, seq) is not None, timeout_s)
    answer = _answer(client, seq)
    assert answer is not None
    return answer


async def test_accepted_only_once_the_replica_has_the_line_and_a_timeout_is_unavailable(
        replicated: Replicated, worker: Proc, tmp_path: Path) -> None:
    gateway, port = start_gateway(replicated.primary.url, tmp_path, VOXROOM_REDIS_WAIT_REPLICAS="1",
                                  VOXROOM_REDIS_WAIT_TIMEOUT_MS=str(WAIT_TIMEOUT_MS))
    on_replica = redis.Redis(port=replicated.replica.port, decode_responses=True)
    on_primary = redis.Redis(port=replicated.primary.port, decode_responses=True)
    room = f"wait-{os.urandom(4).hex()}"
    try:
        async with RoomClient(port, room) as client:
            # 1. A line is accepted, and the replica holds it when the answer arrives.
            answer = await _say(client, "The first line.", 1)
            assert answer["type"] == "accepted", answer
            assert [e["text"] for e in _utt(on_replica, room)] == ["The first line."]

            # 2. The replica paused for less than the WAIT timeout: no answer while it is paused;
            #    the answer comes after SIGCONT, and the replica has the line by then.
            with replicated.replica_paused():
                await client.say("The second line.", voice=VOICE, seq=2)
                await asyncio.sleep(1.0)
                assert _answer(client, 2) is None, "answered while the only replica was paused"
                assert [e["text"] for e in _utt(on_primary, room)][-1] == "The second line."
            await client.wait_for(lambda g: _answer(client, 2) is not None, 15)
            assert _answer(client, 2) == {"type": "accepted", "seq": 2, "utterance": 2}
            assert [e["text"] for e in _utt(on_replica, room)][-1] == "The second line."

            # 3. Paused past the WAIT timeout: unavailable, though the primary has the line.
            with replicated.replica_paused():
                answer = await _say(client, "The third line.", 3)
                assert answer["type"] == "error" and answer["code"] == "unavailable", answer
                assert answer["retry_after_ms"] > 0
                assert [e["text"] for e in _utt(on_primary, room)][-1] == "The third line."
                # Resent while the replica is still paused: the duplicate waits too, and is
                # not answered as if the line were safe.
                answer = await _say(client, "The third line.", 3)
                assert answer["type"] == "error" and answer["code"] == "unavailable", answer
            # The client resends the same seq: the line is there once, answered as today's
            # duplicates are, and only once the replica has it.
            answer = await _say(client, "The third line.", 3)
            assert answer["type"] == "error" and answer["code"] == "duplicate", answer
            assert [e["text"] for e in _utt(on_replica, room)][-1] == "The third line."
            answer = await _say(client, "The fourth line.", 4)
            assert answer == {"type": "accepted", "seq": 4, "utterance": 4}

            # Heard once each, in order.
            ends = await client.wait_ends(4, timeout=60)
            assert [e["utterance"] for e in ends] == [1, 2, 3, 4]
            assert all(e["status"] == "ok" for e in ends), ends
            assert [s["text"] for s in client.got.of("start")] == [
                "The first line.", "The second line.", "The third line.", "The fourth line."]
            for utterance in (1, 2, 3, 4):
                assert len(client.got.frames_of(utterance)) > 5
            assert [e["client_seq"] for e in _utt(on_replica, room)] == ["1", "2", "3", "4"]
            assert client.closed is None

        # The speech API's private rooms accept through the same Ingress: the same WAIT.
        url = f"http://127.0.0.1:{port}/v1/audio/speech"
        body = {"input": "Spoken once confirmed.", "voice": VOICE, "response_format": "pcm"}
        async with httpx.AsyncClient(timeout=30) as http:
            with replicated.replica_paused():
                refused = await http.post(url, json=body)
            assert refused.status_code == 503 and refused.json()["error"]["code"] == "unavailable", refused.text
            spoken = await http.post(url, json=body)
            assert spoken.status_code == 200 and len(spoken.content) > 24_000, spoken.text[:300]
        log = gateway.log_text()
        assert "stored in the primary, not confirmed by the replicas" in log and "replicas confirmed" in log, log[-3000:]
        assert "not stored" not in log, log[-3000:]
        assert "speech: redis unavailable" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
    finally:
        on_replica.close()
        on_primary.close()
        gateway.stop()


async def test_with_wait_off_a_paused_replica_does_not_hold_the_answer(
        replicated: Replicated, worker: Proc, tmp_path: Path) -> None:
    gateway, port = start_gateway(replicated.primary.url, tmp_path, VOXROOM_REDIS_WAIT_REPLICAS="0")
    on_primary = redis.Redis(port=replicated.primary.port, decode_responses=True)
    room = f"nowait-{os.urandom(4).hex()}"
    try:
        async with RoomClient(port, room) as client:
            with replicated.replica_paused():
                answer = await _say(client, "Nobody waits for the replica.", 1)
                # Answered while the replica is still paused: nothing waited for it.
                assert answer == {"type": "accepted", "seq": 1, "utterance": 1}
                assert [e["text"] for e in _utt(on_primary, room)] == ["Nobody waits for the replica."]
            ends = await client.wait_ends(1, timeout=30)
            assert ends[0]["status"] == "ok"
    finally:
        on_primary.close()
        gateway.stop()


def test_a_wait_setting_that_could_block_forever_is_refused_at_start() -> None:
    check_wait(0, 0, 5.0)  # off: the timeout is not used
    check_wait(1, 500, 5.0)
    for replicas, timeout_ms in ((-1, 500), (1, 0), (1, 5000)):
        with pytest.raises(ValueError):
            check_wait(replicas, timeout_ms, 5.0)


@pytest.mark.parametrize("one_connection", [True, False], ids=["one-connection", "pooled-tls-path"])
async def test_ingress_in_process_waits_and_refuses_on_either_connection_path(
        replicated: Replicated, one_connection: bool, stores: Stores) -> None:
    """The ``Ingress`` alone: its pipeline's one connection, and the path for TLS where a batch
    may go out on another pooled connection than the accept's (``EXPIRE`` + ``WAIT`` in a group)."""
    client = redis_client.from_url(replicated.primary.url, decode_responses=True)
    ingress = await stores.ingress(client, wait_replicas=1, wait_timeout_ms=300)
    ingress._pipe.one_connection = one_connection  # type: ignore[attr-defined]  # the TLS path, forced
    on_replica = redis.Redis(port=replicated.replica.port, decode_responses=True)
    rooms = [f"inproc-{os.urandom(4).hex()}" for _ in range(20)]
    try:
        # 20 rooms' lines in one loop turn: each answered accepted once the replica has it.
        outcomes = await asyncio.gather(*(ingress.say(room, "s", 1, f"Line of {room}.", VOICE) for room in rooms))
        assert [(o.status, o.utterance) for o in outcomes] == [("accepted", 1)] * 20
        assert [_utt(on_replica, room)[0]["text"] for room in rooms] == [f"Line of {room}." for room in rooms]
        with replicated.replica_paused():
            with pytest.raises(NotReplicated) as refused:
                await ingress.say(rooms[0], "s", 2, "Unconfirmed.", VOICE)
            assert isinstance(refused.value, REDIS_DOWN)
            with pytest.raises(NotReplicated):
                await ingress.say(rooms[0], "s", 2, "Unconfirmed.", VOICE)  # the resend waits too
        again = await ingress.say(rooms[0], "s", 2, "Unconfirmed.", VOICE)
        assert (again.status, again.utterance) == ("duplicate", 2)
        assert [e["text"] for e in _utt(on_replica, rooms[0])] == [f"Line of {rooms[0]}.", "Unconfirmed."]
    finally:
        on_replica.close()
        await ingress.aclose()
        await client.aclose()
