"""Private lines (issue 30: ``say`` with ``to``), over real processes: a private redis-server, one
worker (espeak-ng), two gateways with auth off and one with auth on. The addressees and the
sender get the line whole; everyone else in the room, on either gateway, gets nothing of it (no
``start``, no frame, no mark, no ``end``, its text nowhere), live and after a ``?resume=`` from
before it, and hears the room's next line after the private one's turn on the room clock.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from tests.support.cuts import assert_whole, ends_of
from tests.support.processes import Proc, start_gateway, start_gateways, start_worker
from tests.support.room_client import Received, RoomClient
from voxroom.store.server import RedisServer
from voxroom.wire import tokens

VOICE = "en-espeak"
PUBLIC_1 = "Night falls on the village."
SECRET = "The player to your left is a werewolf."
PUBLIC_3 = "Everyone, open your eyes."
JWT_SECRET = "private-line-tests-secret-of-32-bytes-or-more"


@dataclass
class PrivateStack:
    gateways: list[int]
    """Two gateways with auth off (clients name themselves with ``?client=``)."""
    auth_port: int


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateStack]:
    logs = tmp_path_factory.mktemp("private-stack")
    with RedisServer() as redis:
        procs: list[Proc] = [start_worker(redis.url, logs, contexts=2)]
        try:
            ports = start_gateways(redis.url, logs, procs)
            auth, auth_port = start_gateway(redis.url, logs, insecure=False, VOXROOM_JWT_SECRET=JWT_SECRET)
            procs.append(auth)
            yield PrivateStack(ports, auth_port)
        finally:
            for proc in procs:
                proc.stop()


def starts(got: Received) -> list[int]:
    return [s["utterance"] for s in got.of("start")]


def assert_heard_nothing_of(got: Received, utterance: int) -> None:
    """Not a message naming the line, not a frame of it, not its text in anything received."""
    assert [m for m in got.messages if m.get("utterance") == utterance] == []
    assert got.frames_of(utterance) == []
    assert "werewolf" not in json.dumps(got.messages)


def assert_after_its_turn(outsider: Received, insider: Received, private: int) -> None:
    """The outsider's next line starts where the private line ended on the room clock: the room
    waited its turn in silence (same clock for everyone), it was not skipped."""
    last = insider.frames_of(private)[-1]
    nxt = next(s for s in outsider.of("start") if s["utterance"] == private + 1)
    assert nxt["pts_ms"] >= last.pts_us / 1000 + 40 - 1, (nxt, last.pts_us)


async def test_a_private_line_reaches_its_audience_and_sender_on_both_gateways(stack: PrivateStack, room: str) -> None:
    a, b = stack.gateways
    async with (RoomClient(a, room, client="gm") as gm, RoomClient(a, room, client="seer") as seer,
                RoomClient(a, room, client="v1") as v1, RoomClient(b, room, client="v2") as v2,
                RoomClient(b, room, client="wolf") as wolf):
        await gm.say(PUBLIC_1, voice=VOICE)
        # "ghost" is in no room: accepted all the same (spoken to whoever of them is there).
        await gm.say(SECRET, voice=VOICE, to=["wolf", "seer", "ghost", "seer"])
        await gm.say(PUBLIC_3, voice=VOICE)
        await gm.wait_for(lambda g: [a["utterance"] for a in g.of("accepted")] == [1, 2, 3], 15)
        for insider in (gm, seer, wolf):
            await insider.wait_for(lambda g: bool(ends_of(g, 3)), 60)
        for outsider in (v1, v2):
            await outsider.wait_for(lambda g: bool(ends_of(g, 3)), 30)

        for insider in (gm, seer, wolf):
            assert starts(insider.got) == [1, 2, 3]
            assert_whole(insider.got, 2)
            start = next(s for s in insider.got.of("start") if s["utterance"] == 2)
            assert (start["text"], start.get("private")) == (SECRET, True)
            assert "to" not in start  # who else was told is not said
        assert [f.payload for f in seer.got.frames_of(2)] == [f.payload for f in wolf.got.frames_of(2)]
        assert [m for m in seer.got.of("marks") if m["utterance"] == 2], "its marks reach the audience"
        for outsider in (v1, v2):
            assert starts(outsider.got) == [1, 3]
            assert_heard_nothing_of(outsider.got, 2)
            assert_whole(outsider.got, 1)
            assert_whole(outsider.got, 3)
            assert_after_its_turn(outsider.got, seer.got, 2)


async def test_a_resume_from_before_a_private_line_replays_it_to_its_audience_only(
        stack: PrivateStack, room: str) -> None:
    a, b = stack.gateways
    async with RoomClient(a, room, client="gm") as gm:
        await gm.say(PUBLIC_1, voice=VOICE)
        await gm.say(SECRET, voice=VOICE, to=["seer"])
        await gm.say(PUBLIC_3, voice=VOICE)
        await gm.wait_for(lambda g: bool(ends_of(g, 3)), 60)
    # Both come back after the fact holding line 1 whole (its end): the replay comes from Redis.
    async with (RoomClient(b, room, client="seer", resume="1.end") as seer,
                RoomClient(a, room, client="villager", resume="1.end") as villager):
        await seer.wait_for(lambda g: bool(ends_of(g, 3)), 30)
        await villager.wait_for(lambda g: bool(ends_of(g, 3)), 30)
        assert starts(seer.got) == [2, 3]
        assert_whole(seer.got, 2)
        assert starts(villager.got) == [3]
        assert_heard_nothing_of(villager.got, 2)
        assert_whole(villager.got, 3)
        assert_after_its_turn(villager.got, seer.got, 2)


@pytest.mark.parametrize("to", [[], [f"p{i}" for i in range(13)], ["a:b"], "seer", [7], ["x" * 65], [None]])
async def test_a_bad_audience_is_bad_message_and_the_connection_stays(stack: PrivateStack, room: str,
                                                                     to: object) -> None:
    async with RoomClient(stack.gateways[0], room) as gm:
        await gm.send_json({"type": "say", "seq": 1, "text": SECRET, "voice": VOICE, "to": to})
        await gm.wait_for(lambda g: bool(g.of("error")), 15)
        [error] = gm.got.of("error")
        assert (error["code"], error["seq"]) == ("bad_message", 1), error
        assert "'to'" in error["message"]
        await gm.say(PUBLIC_1, voice=VOICE, seq=2, to=["p1"] * 12)  # twelve (one id, twelve times) is fine
        await gm.wait_for(lambda g: bool(g.of("accepted")), 15)


async def test_under_auth_the_audience_is_token_subjects_and_a_chosen_id_is_not_one(
        stack: PrivateStack, room: str) -> None:
    """With auth on a client is its token's subject; one without a subject that names itself
    ``seer`` is ``c-seer`` (tokens.SELF_CHOSEN_PREFIX), so it cannot address itself into the
    seer's line."""
    def token(role: tokens.Role, subject: str | None) -> str:
        return tokens.mint(JWT_SECRET, room, role, subject=subject)

    port = stack.auth_port
    async with (RoomClient(port, room, token=token("host", "gm")) as gm,
                RoomClient(port, room, token=token("listener", "seer")) as seer,
                RoomClient(port, room, token=token("listener", None), client="seer") as impostor):
        assert impostor.got.of("welcome")[0]["client"] == tokens.SELF_CHOSEN_PREFIX + "seer"
        await gm.say(SECRET, voice=VOICE, to=["seer"])
        await gm.say(PUBLIC_3, voice=VOICE)
        await seer.wait_for(lambda g: bool(ends_of(g, 2)), 60)
        await impostor.wait_for(lambda g: bool(ends_of(g, 2)), 30)
        assert starts(seer.got) == [1, 2]
        assert_whole(seer.got, 1)
        assert starts(impostor.got) == [2]
        assert_heard_nothing_of(impostor.got, 1)
