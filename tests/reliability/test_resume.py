"""Resume is replay-then-live: a reconnecting client gets what it missed, then live audio, in order,
each entry once, never an ``end`` it already has (issue #12.5). Real redis-server, gateways and a
worker; faults by SIGKILL."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.fanout.resume import ResumePoint, parse, stop_here
from tests.conftest import Stack
from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import Received, RoomClient, resume_point
from voxroom.store.server import RedisServer
from voxroom.wire.protocol import AudioFrame

LINES = [
    ("The night is over. The baker was found in the square, and the village must decide before dusk "
     "who among them is not who they claim to be.", "en-joe"),
    ("Vote now, and vote with care, for a wrong choice tonight costs another life tomorrow.", "en-espeak"),
]


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    with RedisServer() as server:
        yield server


# --- the resume point, pure -----------------------------------------------------------------


def test_resume_points_parse_and_refuse_garbage() -> None:
    assert parse("12.40") == ResumePoint(12, 40)
    assert parse("12.start") == ResumePoint(12, -1)
    assert parse("12.end") == ResumePoint(12, -1, has_end=True)
    assert str(parse("12.end")) == "12.end" and str(parse("3.7")) == "3.7"
    for bad in ("", "12", "12.", "x.1", "0.1", "12.-1", "12.40.end", "1" * 17 + ".1", "12.4e1", "١.٢", "12.٤٠"):
        with pytest.raises(ValueError):
            parse(bad)


def _entry(kind: str, seq: int, chunk: int | None = None) -> dict[bytes, bytes]:
    fields = {b"kind": kind.encode(), b"seq": str(seq).encode()}
    if chunk is not None:
        fields[b"chunk"] = str(chunk).encode()
    return fields


def test_the_position_is_the_exact_entry_held_and_a_second_take_is_not_mistaken_for_it() -> None:
    point = ResumePoint(5, 10)
    assert stop_here(point, _entry("chunk", 5, 10))
    assert not stop_here(point, _entry("chunk", 5, 3)), "a restarted take's earlier slice is not the position"
    assert not stop_here(point, _entry("start", 5)), "nor is a restart's start"
    assert not stop_here(point, _entry("end", 5)), "the client does not have the end"
    assert not stop_here(point, _entry("start", 6))
    assert stop_here(point, _entry("end", 4)), "an earlier utterance: the client's own entries were trimmed"
    assert stop_here(ResumePoint(5, -1, has_end=True), _entry("end", 5))
    assert not stop_here(ResumePoint(5, -1, has_end=True), _entry("chunk", 5, 99))
    assert stop_here(ResumePoint(5, -1), _entry("start", 5))
    assert not stop_here(ResumePoint(5, -1), _entry("chunk", 5, 0))


# --- what a client got, checked ---------------------------------------------------------------


def check_in_order(events: list[dict[str, Any] | AudioFrame]) -> dict[int, int]:
    """Assert that ``events`` (start/end messages and frames, across a client's connections) are
    one stream: utterances in increasing order, each ``start``, slices 0, 1, 2... each once, ``end``
    with that many slices, never a second ``end``. The first utterance may have been joined
    mid-way. Returns utterance -> slices received."""
    current: int | None = None
    next_chunk: int | None = None
    ended: set[int] = set()
    whole: dict[int, int] = {}
    first = True
    for event in events:
        if isinstance(event, AudioFrame):
            if current is None and first:
                current, next_chunk = event.seq, event.chunk  # joined mid-utterance
            assert current == event.seq and event.seq not in ended, f"frame {event.seq}.{event.chunk} outside its take"
            assert event.chunk == next_chunk, f"utterance {event.seq}: slice {event.chunk} after {next_chunk - 1}"
            next_chunk += 1
            whole[event.seq] = whole.get(event.seq, 0) + 1
        elif event.get("type") == "start":
            u = event["utterance"]
            assert current is None or current in ended, f"start of {u} before the end of {current}"
            assert current is None or u > current, f"start of {u} after {current}"
            assert not event.get("restart"), "no worker died in these tests"
            current, next_chunk = u, 0
            whole[u] = 0
        elif event.get("type") == "end":
            u = event["utterance"]
            if current is None and first:
                current = u
            assert u == current and u not in ended, f"end of {u} twice or out of place (current {current})"
            if u in whole and next_chunk is not None and whole[u] == next_chunk:  # it saw this take from 0
                assert event["chunks"] == next_chunk, f"end of {u} says {event['chunks']} slices, got {next_chunk}"
            ended.add(u)
        else:
            continue
        first = False
    return whole


def room_events(got: Received) -> list[dict[str, Any] | AudioFrame]:
    return [e for e in got.stream if isinstance(e, AudioFrame) or e.get("type") in ("start", "end")]


async def listen_then_resume(port: int, room: str, name: str, frames_before: int, until: int,
                             resume_port: int | None = None) -> list[dict[str, Any] | AudioFrame]:
    """Listen until ``frames_before`` frames arrived, leave, come back with ``?resume=`` (on
    ``resume_port``, default the same gateway) and listen until utterance ``until`` ends."""
    async with RoomClient(port, room, client=name) as first:
        await first.wait_for(lambda g: len(g.frames) >= frames_before, 60)
    await asyncio.sleep(random.uniform(0.05, 0.5))  # away long enough to miss some slices
    point = resume_point(first.got)
    async with RoomClient(resume_port or port, room, client=name, resume=point) as again:
        await again.wait_for(lambda g: any(e["utterance"] == until for e in g.ends()), 90)
    return room_events(first.got) + room_events(again.got)


async def test_twelve_listeners_resuming_without_a_fault_get_everything_once_in_order(
        own_redis: RedisServer, tmp_path: Path) -> None:
    worker = start_worker(own_redis.url, tmp_path, contexts=2)
    gateway, port = start_gateway(own_redis.url, tmp_path)
    try:
        async with RoomClient(port, "again", client="speaker") as speaker:
            for text, voice in LINES:
                await speaker.say(text, voice=voice)
            await speaker.wait_for(lambda g: len(g.frames) >= 3, 60)
            results = await asyncio.gather(*(
                listen_then_resume(port, "again", f"l{i}", frames_before=4 + 9 * i, until=2) for i in range(12)))
            await speaker.wait_ends(2, timeout=60)
        everything = check_in_order(room_events(speaker.got))
        for i, events in enumerate(results):
            got = check_in_order(events)
            assert got.get(2) == everything[2], f"listener {i} lost slices of the last line"
    finally:
        gateway.stop()
        worker.stop()


async def test_twenty_listeners_resume_on_another_gateway_after_theirs_is_killed(
        own_redis: RedisServer, tmp_path: Path) -> None:
    worker = start_worker(own_redis.url, tmp_path, contexts=2)
    doomed, port_a = start_gateway(own_redis.url, tmp_path)
    spare, port_b = start_gateway(own_redis.url, tmp_path)
    try:
        async with RoomClient(port_b, "refuge", client="witness") as witness:
            # No self-chosen ids: those stay claimed by the dead gateway for a while (app/room/identity.py);
            # listeners need none to resume, what they hold is in the URL.
            listeners = [RoomClient(port_a, "refuge") for _ in range(20)]
            await asyncio.gather(*(c.__aenter__() for c in listeners))
            for text, voice in LINES:
                await witness.say(text, voice=voice)
            await asyncio.gather(*(c.wait_for(lambda g: len(g.frames) >= 15, 60) for c in listeners))
            doomed.kill()

            async def come_back(old: RoomClient, i: int) -> list[dict[str, Any] | AudioFrame]:
                await old.__aexit__(None, None, None)  # reads to the end of what the dead gateway sent
                await asyncio.sleep(random.uniform(0.0, 0.6))
                async with RoomClient(port_b, "refuge", resume=resume_point(old.got)) as again:
                    await again.wait_for(lambda g: any(e["utterance"] == 2 for e in g.ends()), 90)
                return room_events(old.got) + room_events(again.got)

            results = await asyncio.gather(*(come_back(c, i) for i, c in enumerate(listeners)))
            await witness.wait_ends(2, timeout=60)
        everything = check_in_order(room_events(witness.got))
        for i, events in enumerate(results):
            got = check_in_order(events)
            assert got == everything, f"listener {i}: {got} slices, the witness {everything}"
    finally:
        for g in (doomed, spare):
            g.stop()
        worker.stop()


async def test_the_resume_message_is_honoured_only_where_it_reorders_nothing_and_is_rate_limited(
        stack: Stack, room: str) -> None:
    async with RoomClient(stack.port, room) as speaker:
        await speaker.say("A short line, to be replayed and not to be replayed.", voice="en-espeak")
        await speaker.wait_for(lambda g: len(g.frames) >= 3, 30)
        async with RoomClient(stack.port, room) as late:
            await late.wait_for(lambda g: len(g.frames) >= 2, 30)  # live audio went out to it
            for _ in range(4):
                await late.send_json({"type": "resume", "seq": 1, "chunk": 0})
            await late.wait_for(lambda g: len(g.of("error")) >= 4, 30)
            codes = [e["code"] for e in late.got.of("error")]
            assert codes[0] == "bad_message", "slices it missed cannot come after live ones: refused"
            assert "rate_limited" in codes, codes
            ends = await late.wait_ends(1, timeout=30)
        whole = ends[0]["chunks"]
        check_in_order(room_events(late.got))
        assert len({(f.seq, f.chunk) for f in late.got.frames}) == len(late.got.frames), "nothing twice"
    # A quiet room now: a client that asks at once, before anything was sent to it, gets the replay.
    async with RoomClient(stack.port, room) as returning:
        await returning.send_json({"type": "resume", "seq": 1, "chunk": 4})
        await returning.wait_ends(1, timeout=30)
        assert [f.chunk for f in returning.got.frames] == list(range(5, whole))
        assert returning.got.of("error") == []


async def test_resuming_at_an_entry_never_sends_that_entry_again(stack: Stack, room: str) -> None:
    """``U.end`` got ``end`` U again, ``U.start`` got ``start`` U again, and a position past the
    newest entry got the room's last ``end`` again (issue 28.6). Each resume here is followed by a
    live line: the replay comes before it, so once its ``end`` is in, the replay is complete."""
    async with RoomClient(stack.port, room, client="speaker") as speaker:
        await speaker.say("One short line to resume after.", voice="en-espeak")
        first = (await speaker.wait_ends(1, timeout=60))[0]["utterance"]
        whole = len(speaker.got.frames_of(first))
        assert whole > 2
        # point -> the slices of the first line the client lacks (then its end), or None: it holds all
        cases: dict[str, list[int] | None] = {f"{first}.end": None, f"{first + 50}.end": None,
                                              f"{first}.start": list(range(whole)), f"{first}.1": list(range(2, whole))}
        for n, (point, slices_left) in enumerate(cases.items(), start=2):
            async with RoomClient(stack.port, room, resume=point) as again:
                await speaker.say(f"Live line number {n}.", voice="en-espeak")
                live = (await speaker.wait_ends(n, timeout=60))[-1]["utterance"]
                await again.wait_for(lambda g, live=live: any(e["utterance"] == live for e in g.ends()), 60)
            events = room_events(again.got)
            of_first = ["frame" if isinstance(e, AudioFrame) else e["type"] for e in events
                        if (e.seq if isinstance(e, AudioFrame) else e["utterance"]) == first]
            expected = [] if slices_left is None else ["frame"] * len(slices_left) + ["end"]
            assert of_first == expected, f"?resume={point}: got {of_first} of utterance {first}"
            assert [f.chunk for f in again.got.frames_of(first)] == (slices_left or []), point
            if point == f"{first + 50}.end":  # ahead of the whole stream: it holds all of it
                assert {e["utterance"] for e in again.got.of("start") + again.got.ends()} == {live}, point
            # and the rest, replay then live, each entry once and in order
            assert check_in_order(events).get(live) == len(speaker.got.frames_of(live)), point
