"""Opus over real processes: ``?codec=opus`` clients get the same frames, Opus-encoded once per room."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import websockets

from tests.conftest import Stack
from tests.support.audio import frame_rms, is_speech_like
from tests.support.room_client import RoomClient
from voxroom.wire.protocol import CODEC_OPUS, CODEC_PCM16, ROOM_RATE, SLICE_SAMPLES
from workers.output.opus import PACKET_SAMPLES, PRE_SKIP_SAMPLES, OpusDecoder, unpack_packets


def with_codec(client: RoomClient, codec: str) -> RoomClient:
    client.url += ("&" if "?" in client.url else "?") + f"codec={codec}"
    return client


async def test_an_opus_listener_gets_the_same_frames_as_opus_that_decode_to_the_same_speech(
        stack: Stack, room: str) -> None:
    async with RoomClient(stack.port, room) as pcm, with_codec(RoomClient(stack.port, room), "opus") as opus:
        assert pcm.got.of("welcome")[0]["codec"] == "pcm16"
        assert opus.got.of("welcome")[0]["codec"] == "opus"
        await pcm.say("Good evening, villagers. The wolves are awake tonight.", voice="en-espeak")
        await pcm.wait_ends(1)
        await opus.wait_ends(1)
    assert {f.codec for f in pcm.got.frames} == {CODEC_PCM16}
    assert {f.codec for f in opus.got.frames} == {CODEC_OPUS}
    # Same header, frame for frame: only the payload differs.
    assert [(f.seq, f.chunk, f.pts_us, f.samples, f.first, f.last) for f in opus.got.frames] == \
           [(f.seq, f.chunk, f.pts_us, f.samples, f.first, f.last) for f in pcm.got.frames]
    assert all(len(unpack_packets(f.payload)) >= SLICE_SAMPLES // PACKET_SAMPLES for f in opus.got.frames)

    decoder = OpusDecoder()  # one decoder per utterance
    decoded = np.concatenate([decoder.decode(f.payload) for f in opus.got.frames_of(1)]).astype(np.float64) / 32768
    reference = pcm.got.audio(1).astype(np.float64) / 32768
    assert abs(decoded.size - reference.size) <= PACKET_SAMPLES
    verdict = is_speech_like(decoded, ROOM_RATE)
    assert verdict, verdict.reason
    lagged = decoded[PRE_SKIP_SAMPLES: PRE_SKIP_SAMPLES + reference.size - PRE_SKIP_SAMPLES]
    envelope = np.corrcoef(frame_rms(reference[: lagged.size], ROOM_RATE), frame_rms(lagged, ROOM_RATE))[0, 1]
    assert envelope > 0.9, f"the Opus audio does not follow the PCM's loudness contour ({envelope:.2f})"
    opus_bytes = sum(len(f.payload) for f in opus.got.frames)
    pcm_bytes = sum(len(f.payload) for f in pcm.got.frames)
    assert opus_bytes < pcm_bytes / 8, (opus_bytes, pcm_bytes)


@pytest.mark.parametrize("codec", ["mp3", "OPUS", "1"])
async def test_an_unknown_codec_is_refused_with_1008(stack: Stack, room: str, codec: str) -> None:
    url = f"ws://127.0.0.1:{stack.port}/rooms/{room}/ws?codec={codec}"
    async with websockets.connect(url) as ws:
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), 10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1008
