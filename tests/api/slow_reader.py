"""A slow reader of a long ``POST /v1/audio/speech`` response, shared by the single-Redis test
(tests/api/test_speech_slow_reader.py) and the cluster's (tests/cluster/test_cluster_speech.py).

The workers trim every public room's output stream to the resume window (``MINID``); a response
that reads its private room more slowly than the worker writes it falls behind that window. The
workers here run a 1 s window (the default is 2 minutes: the same fault at a reading pace tests
can wait for) and the synthetic engine at a hundredth of real time, far ahead of the reader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from tests.support.raw_http import RawResponse, RawStream, post
from voxroom.wire.protocol import ROOM_RATE

WORKER_ENV = {"VOXROOM_RESUME_WINDOW_MS": "1000", "VOXROOM_SYNTHETIC_RTF": "0.01"}
SENTENCES = ("The lantern swung once in the wind.", "Nobody in the village slept that night.",
             "At dawn the elder counted the houses, and one door stood open.",
             "They followed the tracks to the river, where the snow was trampled flat.")
PCM_BYTES_PER_S = ROOM_RATE * 2
PACE = 12
"""The reader takes this many seconds of audio a second (a line of the synthetic engine, 36 s,
takes it 3 s, three times the window)."""


def long_input(chars: int = 4000) -> str:
    out, n = "", 0
    while len(out) + 80 < chars:
        out = f"{out} {SENTENCES[n % len(SENTENCES)][:-1]}, said voice {n}.".strip()
        n += 1
    return out


async def read_slowly(port: int, stream_length: Callable[[], Awaitable[int]]) -> tuple[RawResponse, RawResponse,
                                                                                           int]:
    """``(fast, slow, most)``: the response read as fast as it comes, the same read at
    :data:`PACE` times real time, and the longest the private room's output stream was while the
    slow one read (``stream_length`` says it now)."""
    body = {"input": long_input(), "voice": "en-joe", "response_format": "pcm"}
    fast = await post(port, "/v1/audio/speech", body)
    most = 0

    async def watch(resp: RawResponse) -> None:
        nonlocal most
        if len(resp.body) % (64 * 4096) < 4096:  # about every quarter megabyte
            most = max(most, await stream_length())

    stream = RawStream(port, "/v1/audio/speech", body)
    try:
        assert (await stream.start()).status == 200
        slow = await stream.read_body(rate=PACE * PCM_BYTES_PER_S, on_piece=watch, timeout=120)
    finally:
        await stream.close()
    await asyncio.sleep(0)
    return fast, slow, most
