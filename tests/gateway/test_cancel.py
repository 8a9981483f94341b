"""The game master's ``cancel`` (issue 30), over real processes: a private redis-server, one
worker (offline voices, espeak-ng lines of seconds), two gateways. Every listener of the room, on
either gateway, stops at the same slice of a cancelled line, which ends on a fade to silence and
one ``end`` ``cancelled``; a line cancelled before it began sends nothing; the next line plays
whole right after. Who may cancel what is checked on a gateway with auth on.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support.cuts import assert_cut, assert_whole, cancel, ends_of, pcm_of
from tests.support.processes import ROOT, Proc, base_env, start_gateway, start_gateways, start_worker
from tests.support.room_client import RoomClient, resume_point
from voxroom.store.server import RedisServer
from voxroom.wire import tokens

VOICE = "en-espeak"
LONG = ("The night is long and the village sleeps, while somewhere beyond the mill the wolves are "
        "gathering, and the seer turns in her bed, dreaming of a face she cannot quite recall.")
SHORT = "Wake up, village."
SECRET = "cancel-tests-secret-of-at-least-32-bytes!"


@dataclass
class CancelStack:
    redis: RedisServer
    worker: Proc
    gateways: list[int]
    """Two gateways with auth off (every client may cancel any line: ``--insecure-dev``)."""
    auth_port: int
    """A gateway with auth on (roles)."""


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CancelStack]:
    logs = tmp_path_factory.mktemp("cancel-stack")
    with RedisServer() as redis:
        worker = start_worker(redis.url, logs, contexts=2, VOXROOM_CACHE_SLOTS="0")
        procs = [worker]
        try:
            ports = start_gateways(redis.url, logs, procs)
            auth, auth_port = start_gateway(redis.url, logs, insecure=False, VOXROOM_JWT_SECRET=SECRET)
            procs.append(auth)
            yield CancelStack(redis, worker, ports, auth_port)
        finally:
            for proc in procs:
                proc.stop()


async def test_a_line_cancelled_while_it_plays_stops_every_listener_at_the_same_slice(
        stack: CancelStack, room: str) -> None:
    a, b = stack.gateways
    async with RoomClient(a, room) as speaker, RoomClient(a, room) as here, RoomClient(b, room) as there:
        await speaker.say(LONG, voice=VOICE)
        await speaker.say(SHORT, voice=VOICE)
        await here.wait_for(lambda g: len(g.frames_of(1)) >= 25, 30)  # a second of it heard
        assert await cancel(speaker, utterance=1) == {"type": "cancelled", "utterances": [1]}
        for listener in (here, there):
            await listener.wait_ends(2, timeout=30)
        await asyncio.sleep(0.5)  # anything after the cut would have arrived by now
        cut_here, cut_there = assert_cut(here.got, 1), assert_cut(there.got, 1)
        assert cut_here == cut_there, "both gateways' listeners stop at the same slice"
        assert [f.payload for f in here.got.frames_of(1)] == [f.payload for f in there.got.frames_of(1)]
        assert cut_here < 120, "cut well before the line's end (about 9 s)"
        for listener in (here, there):
            assert_whole(listener.got, 2)  # the next line plays whole after the cut
            start2 = next(s for s in listener.got.of("start") if s["utterance"] == 2)
            last1 = listener.got.frames_of(1)[-1]
            # Right after the cut on the room clock, as after any end (not where line 1 would have ended).
            assert start2["pts_ms"] - (last1.pts_us / 1000 + 40) < 2000, (start2, last1.pts_us)
        assert ends_of(speaker.got, 1)[0]["status"] == "cancelled"


async def test_a_queued_line_cancelled_never_starts(stack: CancelStack, room: str) -> None:
    a, _ = stack.gateways
    async with RoomClient(a, room) as speaker, RoomClient(a, room) as listener:
        for text in (SHORT, "This line is cancelled before it begins.", "The seer wakes."):
            await speaker.say(text, voice=VOICE)
        await speaker.wait_for(lambda g: len(g.of("accepted")) == 3, 15)
        assert await cancel(speaker, utterance=2) == {"type": "cancelled", "utterances": [2]}
        await listener.wait_for(lambda g: [e["utterance"] for e in g.ends()] == [1, 3], 30)
        await asyncio.sleep(0.5)
        assert [s["utterance"] for s in listener.got.of("start")] == [1, 3]
        assert listener.got.frames_of(2) == [] and ends_of(listener.got, 2) == []
        assert "cancelled before it begins" not in str(listener.got.messages)
        assert_whole(listener.got, 1)
        assert_whole(listener.got, 3)


async def test_cancel_all_clears_the_playing_line_and_the_four_queued(stack: CancelStack, room: str) -> None:
    a, b = stack.gateways
    async with RoomClient(a, room) as speaker, RoomClient(b, room) as listener:
        await speaker.say(LONG, voice=VOICE)
        for n in range(2, 6):
            await speaker.say(f"Queued line number {n}.", voice=VOICE)
        await listener.wait_for(lambda g: len(g.frames_of(1)) >= 10, 30)
        assert await cancel(speaker, all=True) == {"type": "cancelled", "utterances": [1, 2, 3, 4, 5]}
        await listener.wait_ends(1, timeout=30)
        assert_cut(listener.got, 1)
        # Again at once: whether passed yet or not, the queued lines are cancelled already.
        assert await cancel(speaker, all=True) == {"type": "cancelled", "utterances": []}
        await speaker.say(SHORT, voice=VOICE)  # the room speaks again at once
        await listener.wait_for(lambda g: bool(ends_of(g, 6)), 30)
        await asyncio.sleep(0.3)
        assert [s["utterance"] for s in listener.got.of("start")] == [1, 6]
        assert_whole(listener.got, 6)
        assert await cancel(speaker, all=True) == {"type": "cancelled", "utterances": []}  # nothing left


async def test_who_may_cancel_which_line(stack: CancelStack, room: str) -> None:
    """A sender its own lines (by room number or by its say seq), a ``host`` any line; another
    speaker's cancel of them is ``forbidden``, a listener's too; a finished or unknown line is
    ``not_found``; a malformed cancel is ``bad_message`` and the connection stays."""
    port = stack.auth_port

    def token(role: tokens.Role, sub: str) -> str:
        return tokens.mint(SECRET, room, role, subject=sub)

    alice = RoomClient(port, room, token=token("speaker", "alice"))
    bob = RoomClient(port, room, token=token("speaker", "bob"))
    host = RoomClient(port, room, token=token("host", "gm"))
    ears = RoomClient(port, room, token=token("listener", "ears"))
    async with alice, bob, host, ears:
        assert host.got.of("welcome")[0]["role"] == "host"
        await alice.say(LONG, voice=VOICE, seq=41)
        await alice.say("Alice's second line.", voice=VOICE, seq=42)
        await alice.say("Alice's third line.", voice=VOICE, seq=43)
        await alice.wait_for(lambda g: len(g.of("accepted")) == 3, 15)
        refused = await cancel(bob, utterance=1)
        assert refused["type"] == "error" and refused["code"] == "forbidden", refused
        refused = await cancel(ears, utterance=1)
        assert refused["type"] == "error" and refused["code"] == "forbidden", refused
        assert (await cancel(bob, seq=42))["code"] == "not_found"  # bob never said seq 42
        assert await cancel(bob, all=True) == {"type": "cancelled", "utterances": []}  # none of bob's
        assert await cancel(alice, seq=43) == {"type": "cancelled", "utterances": [3]}
        assert await cancel(host, utterance=2) == {"type": "cancelled", "utterances": [2]}
        await ears.wait_for(lambda g: len(g.frames_of(1)) >= 5, 30)
        assert await cancel(alice, utterance=1) == {"type": "cancelled", "utterances": [1]}
        await ears.wait_ends(1, timeout=30)
        assert (await cancel(alice, utterance=1))["code"] == "not_found"  # finished
        assert (await cancel(alice, utterance=99))["code"] == "not_found"
        for bad in ({}, {"utterance": "1"}, {"utterance": -1}, {"utterance": 2**60}, {"all": False},
                    {"utterance": 1, "seq": 2}, {"seq": True}, {"utterance": 1, "room": "another-room"},
                    {"all": True, "room": "a:b"}, {"utterance": 1, "room": 7}):
            reply = await cancel(alice, **bad)
            assert reply["type"] == "error" and reply["code"] == "bad_message", (bad, reply)
        await asyncio.sleep(0.5)
        assert [s["utterance"] for s in ears.got.of("start")] == [1]
        assert alice.closed is None and ears.closed is None


async def test_a_client_resuming_across_a_cancel_gets_the_same_cut(stack: CancelStack, room: str) -> None:
    a, b = stack.gateways
    async with RoomClient(a, room) as speaker, RoomClient(a, room) as stayed:
        await speaker.say(LONG, voice=VOICE)
        await speaker.say(SHORT, voice=VOICE)
        async with RoomClient(b, room) as left:
            await left.wait_for(lambda g: len(g.frames_of(1)) >= 8, 30)
        held = left.got
        assert await cancel(speaker, utterance=1) == {"type": "cancelled", "utterances": [1]}
        await stayed.wait_ends(2, timeout=30)
        async with RoomClient(b, room, resume=resume_point(held)) as back:
            await back.wait_ends(2, timeout=30)
            await asyncio.sleep(0.3)
        # After the last slice it held (a busy machine may have dropped one of the earlier ones
        # from its queue: the resume point is the last one it got, not how many it got).
        first = held.frames_of(1)[-1].chunk + 1
        got = [f.chunk for f in back.got.frames_of(1)]
        cut = assert_cut(stayed.got, 1)
        assert got == list(range(first, cut)), (first, cut, got, [f.chunk for f in held.frames_of(1)])
        assert [e["status"] for e in back.got.ends()] == ["cancelled", "ok"]


async def test_a_cancelled_line_is_not_restarted_by_the_worker_that_claims_it(
        stack: CancelStack, room: str, tmp_path: Path) -> None:
    """Its worker SIGKILLed mid-line, the line cancelled while nobody holds it: the worker that
    claims it does not begin it again (no ``restart``), it ends it where the dead one stopped."""
    with RedisServer() as redis:
        worker = start_worker(redis.url, tmp_path, name="doomed", VOXROOM_CACHE_SLOTS="0")
        gateway, port = start_gateway(redis.url, tmp_path)
        heir: Proc | None = None
        try:
            async with RoomClient(port, room) as speaker, RoomClient(port, room) as listener:
                await speaker.say(LONG, voice=VOICE)
                await speaker.say(SHORT, voice=VOICE)
                await listener.wait_for(lambda g: len(g.frames_of(1)) >= 10, 30)
                os.kill(worker.pid, signal.SIGKILL)
                worker.popen.wait()
                assert await cancel(speaker, utterance=1) == {"type": "cancelled", "utterances": [1]}
                heir = start_worker(redis.url, tmp_path, name="heir", VOXROOM_CACHE_SLOTS="0",
                                    VOXROOM_CLAIM_IDLE_MS="1000")
                await listener.wait_ends(2, timeout=60)
                await asyncio.sleep(0.3)
                [end] = ends_of(listener.got, 1)
                assert end["status"] == "cancelled"
                assert not [s for s in listener.got.of("start") if s.get("restart")]
                assert [f.chunk for f in listener.got.frames_of(1)] == list(range(end["chunks"]))
                assert_whole(listener.got, 2)
        finally:
            for proc in (heir, gateway, worker):
                if proc is not None:
                    proc.stop()


async def test_http_delete_cancels_as_the_socket_does(stack: CancelStack, room: str) -> None:
    """``DELETE /v1/rooms/{room}/utterances/{n}`` and ``.../utterances`` with a room token: a host
    cancels any line, a speaker its subject's own, a listener none; the room hears the same cut."""
    port = stack.auth_port
    base = f"http://127.0.0.1:{port}/v1/rooms/{room}/utterances"

    def bearer(role: tokens.Role, sub: str, for_room: str = room) -> dict[str, str]:
        return {"Authorization": f"Bearer {tokens.mint(SECRET, for_room, role, subject=sub)}"}

    alice = RoomClient(port, room, token=tokens.mint(SECRET, room, "speaker", subject="alice"))
    ears = RoomClient(port, room, token=tokens.mint(SECRET, room, "listener", subject="ears"))
    async with alice, ears, httpx.AsyncClient(timeout=30) as http:
        await alice.say(LONG, voice=VOICE)
        for n in range(2, 5):
            await alice.say(f"Queued line number {n}.", voice=VOICE)
        await alice.wait_for(lambda g: len(g.of("accepted")) == 4, 15)
        refusals = [
            (await http.delete(f"{base}/1"), 401, "invalid_api_key"),
            (await http.delete(f"{base}/1", headers=bearer("speaker", "bob")), 403, "forbidden"),
            (await http.delete(f"{base}/1", headers=bearer("listener", "ears")), 403, "forbidden"),
            (await http.delete(f"{base}/1", headers=bearer("host", "gm", "another-room")), 401, "invalid_api_key"),
            (await http.delete(f"{base}/99", headers=bearer("host", "gm")), 404, "not_found"),
            (await http.delete(f"{base}/0", headers=bearer("host", "gm")), 400, "bad_message"),
            (await http.delete(f"{base}/x1", headers=bearer("host", "gm")), 400, "bad_message"),
            (await http.delete(f"{base}/{2**60}", headers=bearer("host", "gm")), 400, "bad_message"),
        ]
        for reply, status, code in refusals:
            assert (reply.status_code, reply.json()["error"]["code"]) == (status, code), reply.text
        # Bob's clear finds none of his; alice's own line 3 by her token; the host cuts line 1.
        assert (await http.delete(base, headers=bearer("speaker", "bob"))).json() == {"cancelled": []}
        assert (await http.delete(f"{base}/3", headers=bearer("speaker", "alice"))).json() == {"cancelled": [3]}
        await ears.wait_for(lambda g: len(g.frames_of(1)) >= 10, 30)
        assert (await http.delete(f"{base}/1", headers=bearer("host", "gm"))).json() == {"cancelled": [1]}
        await ears.wait_ends(1, timeout=30)
        assert_cut(ears.got, 1)
        await ears.wait_for(lambda g: len(g.frames_of(2)) >= 1, 30)
        # Line 3 was cancelled already (it waits to be passed): not named again.
        assert (await http.delete(base, headers=bearer("host", "gm"))).json() == {"cancelled": [2, 4]}
        await ears.wait_ends(2, timeout=30)
        await asyncio.sleep(0.5)
        assert [s["utterance"] for s in ears.got.of("start")] == [1, 2]
        assert [e["status"] for e in ears.got.ends()] == ["cancelled", "cancelled"]

    # ``voxroom room`` shows them: 1-4 cancelled (3 and 4 before they began), the rest played.
    shown = subprocess.run([sys.executable, "-m", "voxroom_cli", "room", room], cwd=ROOT, env=base_env(stack.redis.url),
                           capture_output=True, text=True, timeout=60, check=True).stdout
    statuses = {int(row.split()[0]): row.split()[2] for row in shown.splitlines()
                if row.split() and row.split()[0].isdigit() and len(row.split()) > 2}
    assert {n: statuses.get(n) for n in (1, 2, 3, 4)} == {1: "cancelled", 2: "cancelled", 3: "cancelled",
                                                          4: "cancelled"}, shown


async def test_a_cancel_racing_a_lines_end_gives_every_listener_exactly_one_end(stack: CancelStack,
                                                                              room: str) -> None:
    """Eight short lines, each cancelled at a different moment around its end (a seeded spread
    from its start to past its last slice): whichever wins, every listener on either gateway gets
    one ``end`` per line, the same one, ``cancelled`` exactly when the cancel was answered
    ``cancelled`` and ``ok`` when it was answered ``not_found``, and never both."""
    a, b = stack.gateways
    rng = random.Random(30)
    n = 8
    async with RoomClient(a, room) as speaker, RoomClient(a, room) as here, RoomClient(b, room) as there:
        for i in range(1, n + 1):
            await speaker.say(f"Short line {i}.", voice=VOICE)
        answers: dict[int, str] = {}
        for u in range(1, n + 1):
            await speaker.wait_for(lambda g, u=u: any(s["utterance"] == u for s in g.of("start")), 60)
            await asyncio.sleep(rng.uniform(0.0, 1.6))  # each line is about a second
            reply = await cancel(speaker, utterance=u)
            answers[u] = "cancelled" if reply == {"type": "cancelled", "utterances": [u]} else reply["code"]
        for listener in (here, there):
            await listener.wait_for(lambda g: len(g.ends()) >= n, 60)
        await asyncio.sleep(0.5)  # a second end would have arrived by now
        for listener in (here, there):
            ends = listener.got.ends()
            assert [e["utterance"] for e in ends] == list(range(1, n + 1)), ends
            for end in ends:
                u = end["utterance"]
                assert (answers[u], end["status"]) in (("cancelled", "cancelled"), ("not_found", "ok")), \
                    (u, answers, end)
                if end["status"] == "ok":
                    assert_whole(listener.got, u)
                    continue
                # Cut at a slice (faded), or cancelled after its last slice went out (every slice
                # plays, with the line's own fade at its end): either way contiguous, ending
                # quietly, nothing after the end.
                frames = listener.got.frames_of(u)
                assert [f.chunk for f in frames] == list(range(end["chunks"])) and frames[-1].last, (u, end)
                tail = pcm_of(listener.got, u)[-1][-48:].astype(np.int32)  # the last 2 ms
                assert abs(tail).max() <= 64, (u, end, abs(tail).max())
        assert here.got.ends() == there.got.ends()
        print(f"\nanswers: {answers}")
