"""Word marks in a room, over real processes (redis-server, a uvicorn gateway, a worker with
espeak-ng and Piper): every listener gets the same words of ``start.text``, each before the frame
that holds its start and on that frame's clock; a word after a pause starts where the audio comes
back; a cache hit and a resuming client get the same marks as the first take."""

from __future__ import annotations

import re
import uuid
from typing import Any

import numpy as np
import pytest
from redis.asyncio import Redis

from tests.conftest import Stack
from tests.support.room_client import Received, RoomClient
from voxroom.store import keys
from voxroom.wire.protocol import ROOM_RATE, SLICE_MS, AudioFrame
from workers.engines.marks import speech_bounds, split_words

ONSET_TOLERANCE_MS = 80.0
"""How far a word's start may be from where its sound begins (docs/engines.md measures espeak-ng
and Piper well inside it; the issue asks 80 ms for espeak-ng)."""


def words_of(got: Received, utterance: int) -> list[dict[str, Any]]:
    return [w for m in got.of("marks") if m["utterance"] == utterance for w in m["words"]]


def in_line_ms(got: Received, utterance: int, room_ms: float) -> float:
    """A room-clock time as milliseconds into the utterance's audio, by the frame that holds it."""
    frames = got.frames_of(utterance)
    frame = max((f for f in frames if f.pts_us / 1000 <= room_ms + 1e-6), key=lambda f: f.pts_us, default=frames[0])
    return frame.chunk * SLICE_MS + room_ms - frame.pts_us / 1000


def room_audio(got: Received, utterance: int) -> tuple[float, np.ndarray]:
    """The utterance's audio laid out on the room clock: (pts of its first sample, samples)."""
    frames = got.frames_of(utterance)
    t0 = frames[0].pts_us / 1000
    total = round((frames[-1].pts_us / 1000 - t0) * ROOM_RATE / 1000) + frames[-1].samples
    audio = np.zeros(total, dtype=np.float64)
    for f in frames:
        at = round((f.pts_us / 1000 - t0) * ROOM_RATE / 1000)
        audio[at:at + f.samples] = np.frombuffer(f.payload, dtype="<i2") / 32768
    return t0, audio


async def say_and_hear(port: int, room: str, text: str, voice: str, listeners: int = 1) -> tuple[int, list[Received]]:
    clients = [RoomClient(port, room) for _ in range(listeners)]
    for c in clients:
        await c.__aenter__()
    try:
        seq = await clients[0].say(text, voice)
        await clients[0].wait_for(lambda g: any(m.get("seq") == seq for m in g.of("accepted") + g.of("error")), 30)
        accepted = [m for m in clients[0].got.of("accepted") if m["seq"] == seq]
        assert accepted, clients[0].got.of("error")
        utterance = accepted[0]["utterance"]
        for c in clients:
            await c.wait_for(lambda g: any(e["utterance"] == utterance for e in g.ends()), 60)
    finally:
        for c in clients:
            await c.__aexit__(None, None, None)
    for c in clients:
        end = next(e for e in c.got.ends() if e["utterance"] == utterance)
        assert end["status"] == "ok", end
    return utterance, [c.got for c in clients]


def check_marks(got: Received, utterance: int) -> list[dict[str, Any]]:
    """The words of ``start.text``, once each and in order, every one sent before the frame that
    holds its start and placed inside the utterance's audio; returns them."""
    start = next(m for m in got.of("start") if m["utterance"] == utterance)
    words = words_of(got, utterance)
    spoken = re.sub(r"\[[^\]]*\]", lambda m: " " * len(m.group()), start["text"])  # markup makes no word
    assert [(w["text"], w["offset"], w["length"]) for w in words] == \
        [(w.text, w.offset, w.length) for w in split_words(spoken)]
    for w in words:
        assert start["text"][w["offset"]:w["offset"] + w["length"]] == w["text"]
    starts = [w["start_ms"] for w in words]
    assert starts == sorted(starts) and all(w["end_ms"] >= w["start_ms"] for w in words)
    frames = got.frames_of(utterance)
    assert starts[0] >= start["pts_ms"] - 1e-3
    assert words[-1]["end_ms"] <= frames[-1].pts_us / 1000 + SLICE_MS + 1e-3
    # Each word is in the stream before the frame that holds its start.
    for w in words:
        message_at = next(i for i, m in enumerate(got.stream)
                          if isinstance(m, dict) and m.get("type") == "marks" and w in m["words"])
        frame_at = next(i for i, m in enumerate(got.stream) if isinstance(m, AudioFrame) and m.seq == utterance
                        and m.pts_us / 1000 <= w["start_ms"] < m.pts_us / 1000 + SLICE_MS)
        assert message_at < frame_at, w
    return words


@pytest.mark.parametrize("voice", ["en-espeak", "en-joe"])
async def test_two_listeners_get_the_same_words_before_their_audio(stack: Stack, room: str, voice: str) -> None:
    text = f"The night falls on the village. [pause:700] Werewolves, open your eyes {uuid.uuid4().hex[:4]}."
    utterance, (a, b) = await say_and_hear(stack.port, room, text, voice, listeners=2)
    words = check_marks(a, utterance)
    assert words_of(b, utterance) == words, "every listener sees the same words at the same room time"
    # Around the pause: the words after it start where the sound comes back, the words before it
    # end where the sound stops.
    t0, audio = room_audio(a, utterance)
    after = next(i for i, w in enumerate(words) if w["text"] == "Werewolves")
    frame = max(1, int(ROOM_RATE * 0.005))
    power = np.convolve(audio ** 2, np.ones(frame) / frame, mode="same")
    quiet = power < 10 ** (-45 / 10)
    gap_from = round((words[after - 1]["end_ms"] - t0) * ROOM_RATE / 1000)
    resumes = gap_from + int(np.argmax(~quiet[gap_from + frame:])) + frame
    onset_ms = t0 + resumes * 1000 / ROOM_RATE
    assert abs(words[after]["start_ms"] - onset_ms) <= ONSET_TOLERANCE_MS, (words[after], onset_ms)
    assert words[after]["start_ms"] - words[after - 1]["end_ms"] >= 700 - SLICE_MS
    # And the first word starts where the line's sound does.
    bounds = speech_bounds(audio, ROOM_RATE)
    assert bounds is not None
    assert abs(words[0]["start_ms"] - (t0 + bounds[0] * 1000 / ROOM_RATE)) <= ONSET_TOLERANCE_MS


async def test_a_cache_hit_and_a_resuming_client_get_the_first_takes_marks(stack: Stack, room: str,
                                                                         redis_url: str) -> None:
    tag = uuid.uuid4().hex[:6]
    text = f"The seer points at player {tag}, and the moon is full."
    first, (got,) = await say_and_hear(stack.port, room, text, "en-espeak")
    first_words = check_marks(got, first)
    # The same line again: the worker serves it from the audio cache, marks included.
    redis = Redis.from_url(redis_url)
    try:
        stored = [await redis.hget(k, "marks") async for k in redis.scan_iter(match=f"{keys.PREFIX}:cache:*", count=1000)]
    finally:
        await redis.aclose()
    assert any(m and f'"{tag}"'.encode() in m for m in stored), "the line's marks are in the cache"
    second, (again,) = await say_and_hear(stack.port, room, text, "en-espeak")
    second_words = check_marks(again, second)
    assert again.audio(second).tobytes() == got.audio(first).tobytes()

    def in_line(g: Received, u: int, ws: list[dict[str, Any]]) -> list[tuple[str, float]]:
        return [(w["text"], in_line_ms(g, u, w["start_ms"])) for w in ws]

    hit, synthesized = in_line(again, second, second_words), in_line(got, first, first_words)
    assert [t for t, _ in hit] == [t for t, _ in synthesized]
    # The same times into the audio (room times are µs-rounded epoch milliseconds: allow for that).
    assert all(abs(a - b) <= 0.01 for (_, a), (_, b) in zip(hit, synthesized, strict=True)), (hit, synthesized)
    # A client that comes back holding only the start gets the words again, with the audio.
    async with RoomClient(stack.port, room, resume=f"{second}.start") as resumed:
        await resumed.wait_for(lambda g: any(e["utterance"] == second for e in g.ends()), 30)
    assert words_of(resumed.got, second) == second_words
    assert resumed.got.audio(second).tobytes() == again.audio(second).tobytes()
