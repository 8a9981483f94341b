"""ChatTTS lines' word marks in rooms, over real processes (redis-server, a uvicorn gateway, a
worker running the real ChatTTS modules on the tiny random checkpoint): every listener gets a
mark for each word of ``start.text``, in order, offsets into the line as sent (its pause markup
and its own lexicon's respellings mapped back), on the room clock inside the line's audio.

ChatTTS times words per text piece, once the piece's audio is made, so on this CPU the marks
reach the room after the audio they fall in: no check here that a mark precedes its frame
(docs/engines.md "Word timings"). The random model speaks no words and may meet its end token
early on any piece: the checks are on words and their order, never on durations. Both of the
worker's ChatTTS paths: continuous rows (the default) and windowed batches (two rooms speaking
at once share a batch when they fall in one window; a line alone goes through
``stream_timed``)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store.server import RedisServer
from voxroom.wire.protocol import SLICE_MS
from workers.engines.marks import split_words

pytestmark = pytest.mark.chattts

LINES = [
    # Two pieces and a pause (a comma for ChatTTS); "Seer" is said as two words (the line's own
    # lexicon) and still gets one mark; ChatTTS's normalizer drops "3.5" from what it reads.
    ("Night falls on the village. [pause:400] The Seer wakes at 3.5, 天黑请闭眼。", "eng-chattts-1111",
     {"Seer": "see er"}),
    ("Good morning, room two. Werewolves, open your eyes.", "chattts-narrator", None),
]


@pytest.fixture(scope="module", params=["continuous", "windowed"])
def chattts_port(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    from workers.engines.chattts import random_checkpoint

    model = tmp_path_factory.mktemp("chattts-tiny")
    random_checkpoint.build(model, "tiny", seed=0)
    logs = tmp_path_factory.mktemp("chattts-marks-logs")
    with RedisServer() as redis:
        worker = start_worker(redis.url, logs, engine="chattts", contexts=1,
                              VOXROOM_CHATTTS_SOURCE="custom", VOXROOM_CHATTTS_DIR=str(model),
                              VOXROOM_CHATTTS_MAX_NEW_TOKENS="40", VOXROOM_CACHE_SLOTS="0",
                              VOXROOM_CHATTTS_BF16="0",
                              VOXROOM_CHATTTS_CONTINUOUS="1" if request.param == "continuous" else "0")
        gateway, port = start_gateway(redis.url, logs)
        try:
            yield port
        finally:
            gateway.stop()
            worker.stop()


async def hear(port: int, room: str, text: str, voice: str, lexicon: dict[str, str] | None) -> list[RoomClient]:
    """Say ``text`` in ``room`` with two clients in it; both clients once the line has ended."""
    clients = [RoomClient(port, room), RoomClient(port, room)]
    for c in clients:
        await c.__aenter__()
    try:
        msg: dict[str, Any] = {"type": "say", "seq": 1, "text": text, "voice": voice}
        if lexicon is not None:
            msg["lexicon"] = lexicon
        await clients[0].send_json(msg)
        for c in clients:
            ends = await c.wait_ends(1, timeout=120)
            assert ends[0]["status"] == "ok", ends
    finally:
        for c in clients:
            await c.__aexit__(None, None, None)
    return clients


def check_words(client: RoomClient, text: str) -> list[dict[str, Any]]:
    got = client.got
    (start,) = got.of("start")
    assert start["text"] == text
    utterance = start["utterance"]
    words = [w for m in got.of("marks") if m["utterance"] == utterance for w in m["words"]]
    spoken = re.sub(r"\[[^\]]*\]", lambda m: " " * len(m.group()), text)  # markup makes no word
    assert [(w["text"], w["offset"], w["length"]) for w in words] == \
        [(w.text, w.offset, w.length) for w in split_words(spoken)]
    assert all(text[w["offset"]:w["offset"] + w["length"]] == w["text"] for w in words)
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts) and all(w["end_ms"] >= w["start_ms"] for w in words)
    frames = got.frames_of(utterance)
    assert starts[0] >= start["pts_ms"] - 1e-3
    assert words[-1]["end_ms"] <= frames[-1].pts_us / 1000 + SLICE_MS + 1e-3
    return words


async def test_chattts_lines_listeners_get_the_words_of_the_line(chattts_port: int) -> None:
    rooms = await asyncio.gather(*(hear(chattts_port, f"chattts-marks-{i}", text, voice, lexicon)
                                   for i, (text, voice, lexicon) in enumerate(LINES)))
    for (text, _, _), (a, b) in zip(LINES, rooms, strict=True):
        words = check_words(a, text)
        assert check_words(b, text) == words, "every listener gets the same words at the same room time"
    seer = next(w for w in check_words(rooms[0][0], LINES[0][0]) if w["text"] == "Seer")
    assert seer["length"] == 4  # one mark for the word as written, not two for "see er"
