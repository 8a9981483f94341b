"""Voice switches spread over a room's lines, numbered by the real ``say`` script on a real
redis-server: what each ``vx:jobs`` entry carries, what ``:state`` keeps between lines, and what
the worker makes of it (``Job.from_entry``, ``switch_of``)."""

from __future__ import annotations

from typing import cast

from redis import Redis as SyncRedis
from redis.asyncio import Redis

from tests.support.stores import Stores
from voxroom.store import inspection, keys
from voxroom.store.interface import Ingress
from voxroom.store.server import RedisServer
from voxroom.store.single.store import SingleLayout
from voxroom.voices.catalog import Catalog, Voice
from voxroom.wire.jobs import Job
from voxroom_cli import rooms
from workers.utterance import NO_SWITCH, switch_of

CATALOG = Catalog([Voice(v, "chattts", "eng", params={"seed": i}) for i, v in enumerate("abc")], "a")


async def _say_all(r: Redis, ingress: Ingress, room: str, voices: list[str]) -> list[Job]:
    for n, voice in enumerate(voices, start=1):
        assert (await ingress.say(room, "amy", n, f"line {n}", voice)).status == "accepted"
    return await _jobs(r, room)


async def _jobs(r: Redis, room: str) -> list[Job]:
    entries = cast(list[tuple[str, dict[str, str]]], await r.xrange(keys.JOBS))
    return [Job.from_entry(entry_id, fields) for entry_id, fields in entries if fields["room"] == room]


def _switches(jobs: list[Job]) -> list[tuple[str, int, int] | None]:
    return [(j.switch_from, j.switch_line, j.switch_lines) if j.switch_from else None for j in jobs]


async def test_a_switch_is_numbered_over_the_lines_that_follow_it(r: Redis, stores: Stores) -> None:
    ingress = await stores.ingress(r, switch_lines=3)
    try:
        for n, voice in enumerate(["a", "a", "b", "b"], start=1):
            assert (await ingress.say("room", "amy", n, f"line {n}", voice)).status == "accepted"
        # Mid-switch, the room's state says how far the switch got (the next line's number).
        state = await r.hgetall(keys.room_state("room"))
        assert [state[f] for f in ("voice", "switch_from", "switch_line", "switch_lines")] == ["b", "a", "2", "3"]
        # A duplicate does not advance it; the next lines finish it.
        assert (await ingress.say("room", "amy", 4, "line 4", "b")).status == "duplicate"
        for n, voice in enumerate(["b", "b", "c", "a", "c", "c"], start=5):
            assert (await ingress.say("room", "amy", n, f"line {n}", voice)).status == "accepted"
        jobs = await _jobs(r, "room")
        assert [j.voice for j in jobs] == ["a", "a", "b", "b", "b", "b", "c", "a", "c", "c"]
        assert _switches(jobs) == [
            None, None,
            ("a", 0, 3), ("a", 1, 3), ("a", 2, 3),  # a -> b over three lines, the last one ends on b
            None,  # b plain: the switch is over
            ("b", 0, 3),  # b -> c
            ("c", 0, 3),  # -> a before b -> c ended: a new switch from the voice the room was moving to
            ("a", 2, 3),  # back to c: the c -> a path reversed, from where it stood (1/3 of it), no jump
            None,
        ]
        assert [j.prev_voice for j in jobs] == ["a", "a", "a", "b", "b", "b", "b", "c", "a", "c"]  # for old workers
        state = await r.hgetall(keys.room_state("room"))
        assert "switch_from" not in state and "switch_line" not in state, state
        # What the engine is asked for: line k of L covers k/L .. (k+1)/L of the old -> new path.
        ranges = [switch_of(j, CATALOG) for j in jobs]
        assert ranges[2] == (CATALOG.get("a"), (0.0, 1 / 3))
        assert ranges[3] == (CATALOG.get("a"), (1 / 3, 2 / 3))
        assert ranges[4] == (CATALOG.get("a"), (2 / 3, 1.0))
        assert ranges[8] == (CATALOG.get("a"), (2 / 3, 1.0))
        assert ranges[5] == ranges[9] == ranges[0] == NO_SWITCH
    finally:
        await ingress.aclose()


async def test_one_switch_line_switches_within_the_line_and_keeps_no_state(r: Redis, stores: Stores) -> None:
    ingress = await stores.ingress(r, switch_lines=1)
    try:
        jobs = await _say_all(r, ingress, "one", ["a", "b", "b", "c"])
        assert _switches(jobs) == [None, ("a", 0, 1), None, ("b", 0, 1)]
        assert switch_of(jobs[1], CATALOG) == (CATALOG.get("a"), (0.0, 1.0))
        assert "switch_from" not in await r.hgetall(keys.room_state("one"))
    finally:
        await ingress.aclose()


async def test_rooms_switch_independently(r: Redis, stores: Stores) -> None:
    ingress = await stores.ingress(r, switch_lines=2)
    try:
        await _say_all(r, ingress, "x", ["a", "b"])
        jobs = await _say_all(r, ingress, "y", ["c", "c", "c"])
        assert _switches(jobs) == [None, None, None]
        assert (await ingress.say("x", "amy", 3, "line 3", "b")).status == "accepted"
        assert _switches(await _jobs(r, "x")) == [None, ("a", 0, 2), ("a", 1, 2)]
    finally:
        await ingress.aclose()


def test_entries_from_older_gateways_switch_within_the_line() -> None:
    old = {"room": "r", "seq": "2", "text": "hi", "voice": "b", "prev_voice": "a", "sender": "s", "time": "1"}
    job = Job.from_entry("1-0", old)
    assert (job.switch_from, job.switch_line, job.switch_lines) == ("a", 0, 1)
    assert switch_of(job, CATALOG) == (CATALOG.get("a"), (0.0, 1.0))
    assert switch_of(Job.from_entry("1-0", {**old, "prev_voice": "b"}), CATALOG) == NO_SWITCH
    # Out-of-range numbers are ignored (the line is spoken plain), and a retired old voice too.
    bad = Job.from_entry("1-0", {**old, "switch_from": "a", "switch_line": "3", "switch_lines": "3"})
    assert switch_of(bad, CATALOG) == NO_SWITCH
    gone = Job.from_entry("1-0", {**old, "switch_from": "zz", "switch_line": "0", "switch_lines": "3"})
    assert switch_of(gone, CATALOG) == NO_SWITCH


async def test_voxroom_room_shows_a_running_switch(r: Redis, server: RedisServer, stores: Stores) -> None:
    ingress = await stores.ingress(r, switch_lines=3)
    try:
        await _say_all(r, ingress, "shown", ["a", "b"])
    finally:
        await ingress.aclose()
    sync = SyncRedis.from_url(server.url, decode_responses=True)
    try:
        (summary,) = inspection.room_summaries(sync, SingleLayout(), ["shown"])
    finally:
        sync.close()
    assert summary.switch == "a -> b, next line 2 of 3"
    assert "voice switch: a -> b, next line 2 of 3" in rooms.render_room(summary, [], [], [])
