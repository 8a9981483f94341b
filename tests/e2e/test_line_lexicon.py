"""A line's own lexicon (``say``'s ``lexicon``) over real processes: it changes what that line
says, the same text without it (or with another) is never served from its cache entry, and a
malformed one is refused with ``bad_message`` while the socket goes on working."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from tests.conftest import Stack
from tests.support.room_client import RoomClient
from voxroom.wire.protocol import ROOM_RATE


async def speak(port: int, room: str, text: str, voice: str, lexicon: dict[str, str] | None = None, *,
                timeout: float = 60.0) -> npt.NDArray[np.float64]:
    """Say ``text`` (with ``lexicon``) in ``room`` and return its audio; resend (a new seq) while
    the gateway does not see a worker for the voice yet, as a client would."""
    deadline = time.monotonic() + timeout
    async with RoomClient(port, room) as client:
        seq = 0
        while True:
            seq += 1
            msg: dict[str, Any] = {"type": "say", "seq": seq, "text": text, "voice": voice}
            if lexicon is not None:
                msg["lexicon"] = lexicon
            await client.send_json(msg)
            await client.wait_for(lambda g, seq=seq: any(m.get("seq") == seq for m in g.of("accepted") + g.of("error")),
                                  10)
            if any(m["seq"] == seq for m in client.got.of("accepted")):
                break
            error = next(m for m in client.got.of("error") if m.get("seq") == seq)
            assert error["code"] == "unknown_voice" and time.monotonic() < deadline, error
            await asyncio.sleep(0.5)
        utterance = next(m["utterance"] for m in client.got.of("accepted") if m["seq"] == seq)
        await client.wait_for(lambda g: any(e["utterance"] == utterance for e in g.ends()), timeout)
    end = next(e for e in client.got.ends() if e["utterance"] == utterance)
    assert end["status"] == "ok", end
    start = next(m for m in client.got.of("start") if m["utterance"] == utterance)
    assert start["text"] == text  # the line as written: the respelling is for the engine only
    return client.got.audio(utterance).astype(np.float64) / 32768


def seconds(audio: npt.NDArray[np.float64]) -> float:
    return audio.size / ROOM_RATE


@pytest.mark.parametrize(("voice", "line", "word", "respelling"), [
    ("en-espeak", "The {} calls the seer, at last.", "GM", "game master of the village"),
    ("cmn-espeak", "{}的玩家请睁眼。", "重庆", "北京上海"),
])
async def test_the_lines_lexicon_changes_that_line_and_no_other(stack: Stack, room: str, voice: str, line: str,
                                                                word: str, respelling: str) -> None:
    # Lines of this test's own: no other test's audio is in the cache under them. Each under
    # 10 s, the cache's largest entry (480 kB).
    text = line.format(word)
    plain = await speak(stack.port, f"{room}-1", text, voice)
    respelled = await speak(stack.port, f"{room}-2", text, voice, {word: respelling})
    plain_again = await speak(stack.port, f"{room}-3", text, voice)
    respelled_again = await speak(stack.port, f"{room}-4", text, voice, {word: respelling})
    other = await speak(stack.port, f"{room}-5", text, voice, {word: respelling + respelling})
    # The override is heard: several syllables more.
    assert seconds(respelled) - seconds(plain) >= 0.3, (seconds(plain), seconds(respelled))
    # The same text without it is the plain line, served from the plain line's cache entry (espeak-ng
    # never says a line twice sample for sample), never from the override's;
    assert np.array_equal(plain_again, plain)
    # the override's audio is cached under the override,
    assert np.array_equal(respelled_again, respelled)
    # and another override is another entry.
    assert seconds(other) - seconds(respelled) >= 0.3, (seconds(respelled), seconds(other))


BAD = [
    {f"w{i}": "x" for i in range(17)},
    {"GM": "x" * 129},
    {"G" * 65: "gm"},
    {"GM": "[[g'i:Em]]"},
    {"GM": "game [pause:500] master"},
    {"GM": ""},
    {"GM": 7},
    ["GM", "game master"],
]


async def test_a_malformed_lexicon_is_refused_and_the_socket_keeps_working(stack: Stack, room: str) -> None:
    async with RoomClient(stack.port, room) as client:
        for seq, lexicon in enumerate(BAD, start=1):
            await client.send_json({"type": "say", "seq": seq, "text": "The GM wakes.", "voice": "en-espeak",
                                    "lexicon": lexicon})
        # Lone surrogates, in a key and in a respelling (JSON escapes: a text frame is UTF-8 itself).
        for seq, body in enumerate(['{"\\ud800": "x"}', '{"GM": "game \\udc00 master"}'], start=len(BAD) + 1):
            await client.send_raw(f'{{"type": "say", "seq": {seq}, "text": "The GM wakes.", "voice": "en-espeak", '
                                  f'"lexicon": {body}}}')
        good = len(BAD) + 3
        await client.send_json({"type": "say", "seq": good, "text": "The GM wakes.", "voice": "en-espeak",
                                "lexicon": {"GM": "game master"}})
        await client.wait_ends(1, timeout=60)
        assert client.closed is None  # still open: every refusal left the connection alone
    errors = client.got.of("error")
    assert [e["code"] for e in errors] == ["bad_message"] * (good - 1), errors
    # Each refusal names its line, except a surrogate's: that frame is refused before it is read.
    assert [e.get("seq") for e in errors[:len(BAD)]] == list(range(1, len(BAD) + 1))
    assert all("lexicon" in e["message"] for e in errors[:len(BAD)]), errors
    assert [m["seq"] for m in client.got.of("accepted")] == [good]
    assert client.got.ends()[0]["status"] == "ok"
