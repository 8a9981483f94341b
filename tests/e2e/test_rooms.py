"""End to end over real processes: gateway and worker on a real redis-server, real WebSockets."""

from __future__ import annotations

import asyncio

import numpy as np

from tests.conftest import Stack
from tests.support.audio import is_speech_like, max_jump
from tests.support.room_client import RoomClient
from voxroom.wire.protocol import ROOM_RATE, SLICE_SAMPLES

SLICE_US = SLICE_SAMPLES * 1_000_000 // ROOM_RATE


def assert_contiguous(frames: list, utterance: int) -> None:
    """Chunks 0..n-1 in order, each presentation time exactly one slice after the previous."""
    mine = [f for f in frames if f.seq == utterance]
    assert [f.chunk for f in mine] == list(range(len(mine))), "chunks missing or out of order"
    gaps = {b.pts_us - a.pts_us for a, b in zip(mine, mine[1:], strict=False)}
    assert gaps <= {SLICE_US}, f"presentation times not contiguous inside the utterance: {sorted(gaps)[:5]}"
    assert mine[0].first and mine[-1].last


async def test_two_clients_hear_the_same_utterances_and_another_room_hears_nothing(stack: Stack, room: str) -> None:
    async with RoomClient(stack.port, room) as alice, RoomClient(stack.port, room) as bob, \
            RoomClient(stack.port, room + "-other") as outsider:
        await alice.say("The night falls on the village.", voice="en-joe")
        await bob.say("Everybody closes their eyes.", voice="en-espeak")
        await alice.wait_ends(2)
        await bob.wait_ends(2)
        await asyncio.sleep(0.3)
        for client in (alice, bob):
            assert [e["utterance"] for e in client.got.ends()] == [1, 2]
            assert all(e["status"] == "ok" for e in client.got.ends())
            starts = client.got.of("start")
            assert [(s["utterance"], s["voice"]) for s in starts] == [(1, "en-joe"), (2, "en-espeak")]
            for utterance in (1, 2):
                assert_contiguous(client.got.frames, utterance)
            pts = [f.pts_us for f in client.got.frames]
            assert pts == sorted(pts), "presentation times must increase across utterances"
            # Utterance 2 plays after utterance 1 ends (never overlapping it).
            last_1 = client.got.frames_of(1)[-1]
            assert client.got.frames_of(2)[0].pts_us >= last_1.pts_us + SLICE_US
        assert [(f.seq, f.chunk, f.payload) for f in alice.got.frames] == \
               [(f.seq, f.chunk, f.payload) for f in bob.got.frames]
        assert outsider.got.frames == [] and outsider.got.of("start") == []


async def test_english_and_mandarin_audio_is_speech_of_plausible_length(stack: Stack, room: str) -> None:
    lines = [
        ("en-joe", "Good evening, villagers. Tonight the werewolves will choose their victim."),
        ("cmn-espeak", "天黑请闭眼，狼人请睁眼。"),
    ]
    async with RoomClient(stack.port, room) as client:
        for voice, text in lines:
            await client.say(text, voice=voice)
        await client.wait_ends(2)
    # 11 English words: 2-7 s at ordinary speaking rates; 11 Mandarin syllables at 2.5-6 per
    # second (espeak reads slowly): 1.8-4.5 s, plus the engines' leading and trailing silence.
    bounds = {1: (2.0, 7.0), 2: (1.5, 6.0)}
    for utterance, (low, high) in bounds.items():
        audio = client.got.audio(utterance).astype(np.float32) / 32768.0
        seconds = audio.size / ROOM_RATE
        assert low <= seconds <= high, f"utterance {utterance}: {seconds:.2f} s"
        verdict = is_speech_like(audio, ROOM_RATE)
        assert verdict, f"utterance {utterance} is not speech-like: {verdict}"
        # Slices join without clicks: no sample step at a slice boundary far above the local level.
        joins = np.arange(SLICE_SAMPLES, audio.size, SLICE_SAMPLES)
        assert max_jump(audio, ROOM_RATE, at=joins) < 8.0


async def test_quick_succession_from_different_clients_plays_in_seq_order(stack: Stack, room: str) -> None:
    async with RoomClient(stack.port, room) as a, RoomClient(stack.port, room) as b, \
            RoomClient(stack.port, room) as c:
        # Different lengths and engines so that parallel contexts finish out of order.
        await asyncio.gather(
            a.say("One, a rather long first line so that it takes the longest to synthesize.", voice="en-joe"),
            b.say("Two.", voice="en-espeak"),
            c.say("三。", voice="cmn-espeak"),
        )
        ends = await a.wait_ends(3)
        accepted = sorted(m["utterance"] for cl in (a, b, c) for m in cl.got.of("accepted"))
        assert accepted == [1, 2, 3]
        assert [e["utterance"] for e in ends] == [1, 2, 3]
        order = [f.seq for f in a.got.frames]
        assert order == sorted(order), "audio of the room must come out in seq order"
        for utterance in (1, 2, 3):
            assert_contiguous(a.got.frames, utterance)
