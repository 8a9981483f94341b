"""A line streamed in is heard, not only measured (issue 31): an English narration sent as an open
line, a few words at a time, through the suite's stack (Piper's ``en-joe``); an offline recognizer
(faster-whisper with Whisper base, the ``asr`` extra's weights; ../shared/FACTS.md) transcribes what
a listener of the room received, and hears every piece, in the order it was sent."""

from __future__ import annotations

import asyncio
import difflib
from typing import Any

import numpy as np

from tests.conftest import Stack
from tests.e2e.test_lexicon_heard import heard, recognizer  # noqa: F401  (the module's fixture)
from tests.support.heard import assert_heard_whole_once_in_order
from tests.support.room_client import RoomClient

PIECES = ["The village", " sleeps under the moon.", " Two wolves", " walk to the old mill,",
          " and the baker", " dreams of bread."]
PIECE_WORDS = [("village",), ("sleeps", "moon"), ("two", "wolves"), ("walk", "old", "mill"), ("baker",),
               ("dreams", "bread")]
"""The words of each piece: the recognizer must hear one of them at least, each piece after the one
before. One of them, and nearly (a similarity of 0.8: "leaps" for "sleeps"): Whisper base on
Piper's voice misses a word now and then, and where the clauses are cut (which depends on when the
pieces arrive and how fast Piper is on a busy machine) changes what it hears; a piece lost or out of
order fails either way."""


def _position(words: list[str], piece: tuple[str, ...], after: int) -> int:
    """Where a word of ``piece`` is first heard after ``after`` (-1: nowhere)."""
    def near(word: str, wanted: str) -> bool:
        return difflib.SequenceMatcher(None, word.rstrip("s"), wanted.rstrip("s")).ratio() >= 0.8

    return next((i for i, w in enumerate(words) if i > after and any(near(w, k) for k in piece)), -1)


async def test_every_piece_of_a_streamed_line_is_heard_in_order(stack: Stack, room: str,
                                                                recognizer: Any) -> None:  # noqa: F811
    async with RoomClient(stack.port, room) as speaker, RoomClient(stack.port, room) as listener:
        await speaker.send_json({"type": "say", "seq": 1, "text": PIECES[0], "voice": "en-joe", "open": True})
        for part, piece in enumerate(PIECES[1:], start=1):
            await asyncio.sleep(0.25)
            await speaker.send_json({"type": "append", "seq": 1, "part": part, "text": piece,
                                     "final": part == len(PIECES) - 1})
        [end] = await listener.wait_ends(1, timeout=90)
        assert end["status"] == "ok", end
        assert speaker.got.of("error") == []
    assert_heard_whole_once_in_order(listener.got, 1)  # every slice, once, in order: nothing dropped
    audio = listener.got.audio(1).astype(np.float64) / 32768.0
    words = heard(recognizer, audio).split()
    positions: list[int] = []
    for piece in PIECE_WORDS:
        positions.append(_position(words, piece, positions[-1] if positions else -1))
        assert positions[-1] >= 0, (piece, positions, " ".join(words))
