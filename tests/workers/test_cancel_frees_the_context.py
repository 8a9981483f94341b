"""A cancelled line stops being synthesized and its context takes the next job (issue 30), over
real processes: one worker with one context of the synthetic engine at half real time (a line
takes twice its length to make, as a slow CPU voice would), one gateway, a real redis-server.

Line 1 is about 35 s of audio, so about 70 s of synthesis; line 2 is short and can only be made
once the context is free. Cancelled a second into line 1, line 2 must be heard whole long before
line 1's synthesis could have ended: the cancel reached the engine, not just the room. The same
holds for a line cancelled while it waits for its turn behind a playing one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.cuts import assert_cut, assert_whole, cancel, ends_of
from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store.server import RedisServer

LONG = ("The night is long and the village sleeps, while somewhere beyond the mill the wolves are "
        "gathering in the dark, and the seer turns in her bed, dreaming of a face she cannot recall. " * 3)[:490]
SHORT = "Wake up, village."
SYNTHESIS_S = 2 * len(LONG) / 14.0
"""Line 1's synthesis at the synthetic engine's 14 characters a second and real-time factor 2."""


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    logs = tmp_path_factory.mktemp("cancel-engine")
    with RedisServer() as redis:
        worker = start_worker(redis.url, logs, engine="synthetic", contexts=1, VOXROOM_SYNTHETIC_RTF="2.0",
                              VOXROOM_CACHE_SLOTS="0")
        try:
            gateway, gateway_port = start_gateway(redis.url, logs)
            try:
                yield gateway_port
            finally:
                gateway.stop()
        finally:
            worker.stop()


async def test_a_cancelled_playing_line_frees_its_context_for_the_next(port: int, room: str) -> None:
    async with RoomClient(port, room) as speaker, RoomClient(port, room) as listener:
        await speaker.say(LONG)
        await speaker.say(SHORT)
        await listener.wait_for(lambda g: len(g.frames_of(1)) >= 10, 30)
        assert await cancel(speaker, utterance=1) == {"type": "cancelled", "utterances": [1]}
        # Well inside line 1's synthesis time (70 s), even with the suite's timeout factor.
        await listener.wait_for(lambda g: bool(ends_of(g, 2)), SYNTHESIS_S / 3)
        assert_cut(listener.got, 1)
        assert_whole(listener.got, 2)


async def test_a_line_cancelled_while_it_waits_stops_its_synthesis(port: int, room: str) -> None:
    """Line 2 is long and waits behind line 1, whose synthesis it would follow on the one
    context; cancelled before it starts, it is never heard and line 3 follows line 1 at once."""
    async with RoomClient(port, room) as speaker, RoomClient(port, room) as listener:
        await speaker.say("The first line is a short one.")
        await speaker.say(LONG)
        await speaker.say(SHORT)
        await speaker.wait_for(lambda g: len(g.of("accepted")) == 3, 15)
        assert await cancel(speaker, utterance=2) == {"type": "cancelled", "utterances": [2]}
        await listener.wait_for(lambda g: bool(ends_of(g, 3)), SYNTHESIS_S / 3)
        assert [s["utterance"] for s in listener.got.of("start")] == [1, 3]
        assert listener.got.frames_of(2) == []
        assert_whole(listener.got, 1)
        assert_whole(listener.got, 3)
