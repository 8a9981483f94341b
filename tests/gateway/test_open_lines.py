"""Lines streamed in as they are written (issue 31: ``say`` with ``open``, ``append``, ``flush``),
over real processes: a private redis-server, one worker (espeak-ng lines, the open-line idle bound
lowered to 6 s), two gateways. The room hears one utterance: one ``start``, contiguous slices, one
``end``, ``text`` messages whose pieces, after ``start.text``, are the line's whole text in order,
and marks that point into that whole text.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cuts import assert_whole, ends_of
from tests.support.processes import Proc, start_gateway, start_gateways, start_worker
from tests.support.room_client import Received, RoomClient
from voxroom.store.server import RedisServer

VOICE = "en-espeak"
# Low enough that the idle test is short; high enough that a busy machine's delay between a
# speaker's pieces (a flush heard, then the next append) never closes a line the test keeps open.
IDLE_S = 6.0
PIECES = ["The night", " falls on the village.", " The wolves wake", ", and the seer dreams", " of a face."]


@pytest.fixture(scope="module")
def ports(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[int]]:
    logs = tmp_path_factory.mktemp("open-lines")
    with RedisServer() as redis:
        procs: list[Proc] = [start_worker(redis.url, logs, contexts=2, VOXROOM_OPEN_LINE_IDLE_S=str(IDLE_S))]
        try:
            yield start_gateways(redis.url, logs, procs)
        finally:
            for proc in procs:
                proc.stop()


async def open_line(client: RoomClient, seq: int, text: str = "", **extra: Any) -> None:
    await client.send_json({"type": "say", "seq": seq, "text": text, "voice": VOICE, "open": True, **extra})


async def append(client: RoomClient, seq: int, part: int, text: str = "", *, final: bool = False) -> None:
    msg: dict[str, Any] = {"type": "append", "seq": seq, "part": part, "text": text}
    if final:
        msg["final"] = True
    await client.send_json(msg)


def assert_spoken_whole(got: Received, utterance: int) -> None:
    """One ``end`` ``ok`` and every slice up to its ``chunks``, in order. The last slice of an
    open line closed after its audio went out (idle, or a ``final`` with no text) cannot have been
    flagged ``last``: the ``end`` says where it ended (docs/protocol.md)."""
    [end] = ends_of(got, utterance)
    assert end["status"] == "ok", end
    assert [f.chunk for f in got.frames_of(utterance)] == list(range(end["chunks"])), end
    assert end["chunks"] > 0


def whole_text(got: Received, utterance: int) -> str:
    """``start.text`` and the ``text`` pieces after it, each placed at its offset."""
    [start] = [s for s in got.of("start") if s["utterance"] == utterance]
    text = start["text"]
    for piece in (m for m in got.of("text") if m["utterance"] == utterance):
        assert piece["offset"] == len(text), (piece, text)
        text += piece["text"]
    return text


def assert_marks_point_into(got: Received, utterance: int, text: str) -> None:
    words = [w for m in got.of("marks") if m["utterance"] == utterance for w in m["words"]]
    assert words, "the line's words are marked"
    for w in words:
        assert text[w["offset"]:w["offset"] + w["length"]] == w["text"], (w, text)
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts)
    assert [w["offset"] for w in words] == sorted(w["offset"] for w in words)


async def test_two_listeners_on_two_gateways_hear_one_utterance_of_every_piece_in_order(
        ports: list[int], room: str) -> None:
    a, b = ports
    async with RoomClient(a, room) as speaker, RoomClient(a, room) as here, RoomClient(b, room) as there:
        await open_line(speaker, 1, PIECES[0])
        await speaker.wait_for(lambda g: bool(g.of("accepted")), 15)
        for part, piece in enumerate(PIECES[1:], start=1):
            await asyncio.sleep(0.15)  # a model writing as it goes
            await append(speaker, 1, part, piece, final=part == len(PIECES) - 1)
        for listener in (here, there):
            await listener.wait_for(lambda g: bool(ends_of(g, 1)), 60)
        await asyncio.sleep(0.3)
        for listener in (here, there):
            assert [s["utterance"] for s in listener.got.of("start")] == [1]
            assert_whole(listener.got, 1)
            assert whole_text(listener.got, 1) == "".join(PIECES)
            assert_marks_point_into(listener.got, 1, "".join(PIECES))
        assert [f.payload for f in here.got.frames_of(1)] == [f.payload for f in there.got.frames_of(1)]
        assert speaker.got.of("error") == []
        # About 5 s of speech: the clauses of the whole text, not only the first piece.
        assert len(here.got.frames_of(1)) * 40 > 3000


async def test_parts_are_checked_resent_ones_are_duplicate_and_a_closed_line_takes_no_more(
        ports: list[int], room: str) -> None:
    a, _ = ports
    async with RoomClient(a, room, client="narrator") as speaker, RoomClient(a, room) as listener:
        await open_line(speaker, 4, "Once")
        await append(speaker, 4, 1, " upon a time.")
        await append(speaker, 4, 1, " upon a time.")  # resent: duplicate, never spoken twice
        await append(speaker, 4, 3, " a gap")  # part 2 never came: bad_message
        await append(speaker, 9, 1, " no such line")  # not_found
        await append(speaker, 4, 2, " The end.", final=True)
        await append(speaker, 4, 3, " After the end.")  # closed: not_found
        await speaker.wait_for(lambda g: len(g.of("error")) >= 4, 15)
        codes = [(e["code"], e["seq"]) for e in speaker.got.of("error")]
        assert codes == [("duplicate", 4), ("bad_message", 4), ("not_found", 9), ("not_found", 4)], codes
        await listener.wait_for(lambda g: bool(ends_of(g, 1)), 60)
    # Reconnected as the same client, everything resent: all duplicate, nothing spoken again.
    async with RoomClient(a, room, client="narrator", resume="1.end") as again:
        for part, text in ((1, " upon a time."), (2, " The end.")):
            await append(again, 4, part, text, final=part == 2)
        await again.wait_for(lambda g: len(g.of("error")) == 2, 15)
        assert [e["code"] for e in again.got.of("error")] == ["not_found", "not_found"]  # gone with its end
        await asyncio.sleep(0.5)
        assert again.got.of("start") == []
    assert whole_text(listener.got, 1) == "Once upon a time. The end."


async def test_an_idle_open_line_closes_itself_and_the_rooms_next_line_plays(ports: list[int], room: str) -> None:
    a, b = ports
    async with RoomClient(a, room) as speaker, RoomClient(b, room) as listener:
        await open_line(speaker, 1, "The model stopped writing here.")
        await speaker.say("And the room goes on.", voice=VOICE, seq=2)
        await listener.wait_for(lambda g: bool(ends_of(g, 2)), 60)
        assert [s["utterance"] for s in listener.got.of("start")] == [1, 2]
        assert_spoken_whole(listener.got, 1)
        assert_whole(listener.got, 2)
        await append(speaker, 1, 1, " Too late.")  # closed by the idle bound
        await speaker.wait_for(lambda g: bool(g.of("error")), 15)
        assert speaker.got.of("error")[0]["code"] == "not_found"


async def test_a_flush_speaks_a_half_sentence_now_and_is_answered_to_its_sender_only(
        ports: list[int], room: str) -> None:
    a, b = ports
    async with RoomClient(a, room) as speaker, RoomClient(b, room) as listener:
        await open_line(speaker, 3, "The wolves are choosing")  # no mark: it would wait for one
        await speaker.wait_for(lambda g: bool(g.of("accepted")), 15)
        await asyncio.sleep(0.5)
        assert listener.got.frames_of(1) == [], "half a sentence waits for its end"
        await speaker.send_json({"type": "flush", "seq": 3})
        await speaker.wait_for(lambda g: bool(g.of("flushed")), 30)
        assert speaker.got.of("flushed") == [{"type": "flushed", "seq": 3, "part": 0}]
        await listener.wait_for(lambda g: len(g.frames_of(1)) > 10, 15)  # heard before the line ends
        assert ends_of(listener.got, 1) == []
        await append(speaker, 3, 1, " their prey.", final=True)
        await listener.wait_for(lambda g: bool(ends_of(g, 1)), 60)
        assert_whole(listener.got, 1)
        assert whole_text(listener.got, 1) == "The wolves are choosing their prey."
        assert listener.got.of("flushed") == []


async def test_a_worker_killed_mid_line_is_replaced_and_the_line_is_spoken_whole_once(
        room: str, tmp_path: Path) -> None:
    """Its worker SIGKILLed while the line is open and speaking, a piece appended while no worker
    holds it: the worker that claims the line says it again from the start (``restart``), every
    piece received so far and the ones after, in one take, and ends it once."""
    with RedisServer() as redis:
        worker = start_worker(redis.url, tmp_path, name="doomed", VOXROOM_CACHE_SLOTS="0")
        gateway, port = start_gateway(redis.url, tmp_path)
        heir: Proc | None = None
        try:
            async with RoomClient(port, room) as speaker, RoomClient(port, room) as listener:
                await open_line(speaker, 1, PIECES[0])
                await append(speaker, 1, 1, PIECES[1])
                await append(speaker, 1, 2, PIECES[2])
                await listener.wait_for(lambda g: len(g.frames_of(1)) >= 10, 30)
                os.kill(worker.pid, signal.SIGKILL)
                worker.popen.wait()
                await append(speaker, 1, 3, PIECES[3])  # stored while nobody speaks the line
                # The idle bound counts from the last piece (part 3, before the heir started): a
                # busy machine can take the default 10 s to start the heir and show its restart,
                # and the heir would close the line, rightly idle, before part 4 came.
                heir = start_worker(redis.url, tmp_path, name="heir", VOXROOM_CACHE_SLOTS="0",
                                    VOXROOM_CLAIM_IDLE_MS="1000", VOXROOM_OPEN_LINE_IDLE_S="60")
                await listener.wait_for(lambda g: any(s.get("restart") for s in g.of("start")), 60)
                await append(speaker, 1, 4, PIECES[4], final=True)
                await listener.wait_for(lambda g: bool(ends_of(g, 1)), 60)
                await asyncio.sleep(0.3)
                assert speaker.got.of("error") == []
                [end] = ends_of(listener.got, 1)
                assert end["status"] == "ok"
                # The second take, from its restart marker on: whole, in order, every piece once.
                taken = listener.got.stream[next(i for i, m in enumerate(listener.got.stream)
                                                 if isinstance(m, dict) and m.get("restart")):]
                frames = [m for m in taken if not isinstance(m, dict)]
                assert [f.chunk for f in frames] == list(range(end["chunks"]))
                again = Received(messages=[m for m in taken if isinstance(m, dict)])
                assert whole_text(again, 1) == "".join(PIECES)
        finally:
            for proc in (heir, gateway, worker):
                if proc is not None:
                    proc.stop()


async def test_an_open_line_is_cancelled_like_any_line_and_takes_no_more_pieces(ports: list[int], room: str) -> None:
    a, b = ports
    async with RoomClient(a, room) as speaker, RoomClient(b, room) as listener:
        await open_line(speaker, 5, "The night is long and the village sleeps, ")
        await append(speaker, 5, 1, "while beyond the mill the wolves gather, and the seer dreams of faces, ")
        await listener.wait_for(lambda g: len(g.frames_of(1)) >= 10, 30)
        await speaker.send_json({"type": "cancel", "seq": 5})
        await speaker.wait_for(lambda g: bool(g.of("cancelled")), 15)
        assert speaker.got.of("cancelled")[0]["utterances"] == [1]
        await listener.wait_for(lambda g: bool(ends_of(g, 1)), 30)
        [end] = ends_of(listener.got, 1)
        assert end["status"] == "cancelled"
        assert [f.chunk for f in listener.got.frames_of(1)] == list(range(end["chunks"]))
        await asyncio.sleep(0.3)
        await append(speaker, 5, 2, "and on.")
        await speaker.wait_for(lambda g: bool(g.of("error")), 15)
        assert speaker.got.of("error")[0]["code"] == "not_found"  # the line is over, its pieces gone


async def test_a_private_open_line_reaches_its_audience_only_text_pieces_included(ports: list[int],
                                                                                  room: str) -> None:
    a, b = ports
    async with (RoomClient(a, room, client="gm") as gm, RoomClient(b, room, client="seer") as seer,
                RoomClient(b, room, client="villager") as villager):
        await open_line(gm, 1, "Seer,", to=["seer"])
        await append(gm, 1, 1, " the baker is a werewolf.", final=True)
        await gm.say("Everyone, wake up.", voice=VOICE, seq=2)
        await villager.wait_for(lambda g: bool(ends_of(g, 2)), 60)
        await seer.wait_for(lambda g: bool(ends_of(g, 2)), 30)
        assert whole_text(seer.got, 1) == "Seer, the baker is a werewolf."
        assert [s["utterance"] for s in villager.got.of("start")] == [2]
        assert [m for m in villager.got.messages if m.get("utterance") == 1] == []
        assert "werewolf" not in str(villager.got.messages) and villager.got.frames_of(1) == []


async def test_an_open_line_is_bounded_to_4000_characters_and_1000_parts(ports: list[int], room: str) -> None:
    a, _ = ports
    piece = ("The wolves are gathering. " * 19)[:490]
    async with RoomClient(a, room) as speaker:
        await open_line(speaker, 1, piece)
        for part in range(1, 9):  # 9 x 490 = 4410: the 8th append would pass 4000
            await append(speaker, 1, part, piece)
        await speaker.wait_for(lambda g: bool(g.of("error")), 15)
        [error] = speaker.got.of("error")
        assert (error["code"], error["seq"]) == ("text_too_long", 1), error
        assert "4000" in error["message"]
        await append(speaker, 1, 8, "", final=True)  # the refused part's number is still free
        await speaker.send_json({"type": "append", "seq": 1, "part": 1001, "text": "x"})
        await speaker.wait_for(lambda g: len(g.of("error")) == 2, 15)
        assert speaker.got.of("error")[1]["code"] == "bad_message"  # parts count to 1000
        await speaker.send_json({"type": "append", "seq": 1, "part": 2, "text": "x" * 501})
        await speaker.wait_for(lambda g: len(g.of("error")) == 3, 15)
        assert speaker.got.of("error")[2]["code"] == "text_too_long"  # 500 to speak a piece
        await speaker.send_json({"type": "cancel", "all": True})  # a minute of speech: not for this test
        await speaker.wait_for(lambda g: bool(g.of("cancelled")), 15)
