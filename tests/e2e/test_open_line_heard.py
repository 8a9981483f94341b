"""A line streamed in is heard, not only measured (issue 31): an English narration sent as an open
line, a few words at a time, through the suite's stack (Piper's ``en-joe``); an offline recognizer
(faster-whisper with Whisper base, the ``asr`` extra's weights; ../shared/FACTS.md) transcribes what
a listener of the room received, and hears every piece, in the order it was sent."""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np

from tests.conftest import Stack
from tests.e2e.test_lexicon_heard import heard, recognizer  # noqa: F401  (the module's fixture)
from tests.support.room_client import RoomClient

PIECES = ["The village", " sleeps under the moon.", " Two wolves", " walk to the old mill,",
          " and the baker", " dreams of bread."]
KEYWORDS = ["village", "moon", "wolves", "mill", "baker", "bread"]
"""One word of each piece that the recognizer must hear, in this order."""


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
    audio = listener.got.audio(1).astype(np.float64) / 32768.0
    words = heard(recognizer, audio).split()
    positions = [next((i for i, w in enumerate(words) if w.rstrip("s") == k.rstrip("s")), -1) for k in KEYWORDS]
    assert -1 not in positions, (KEYWORDS, words)
    assert positions == sorted(positions), (KEYWORDS, words)
