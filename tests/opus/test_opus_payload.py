"""Opus payloads: the length-prefixed packet layout, and an encode/decode round trip with PyAV."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.audio import dbfs, frame_rms, rms
from voxroom.wire.protocol import CODEC_OPUS, ROOM_RATE, SLICE_SAMPLES, AudioFrame
from workers.output.opus import PACKET_SAMPLES, PRE_SKIP_SAMPLES, OpusDecoder, OpusEncoder, pack_packets, unpack_packets


def test_packets_round_trip_and_truncation_is_an_error() -> None:
    packets = [b"\x01\x02", b"", bytes(range(256)) * 3]
    payload = pack_packets(packets)
    assert payload[:2] == b"\x00\x02"
    assert unpack_packets(payload) == packets
    for cut in (1, 3, len(payload) - 1):
        with pytest.raises(ValueError):
            unpack_packets(payload[:cut])
    with pytest.raises(ValueError):
        pack_packets([b"x" * 70_000])


def _speechy(seconds: float) -> np.ndarray:
    t = np.arange(int(seconds * ROOM_RATE)) / ROOM_RATE
    pitch = 120 + 20 * np.sin(2 * np.pi * 0.7 * t)
    phase = 2 * np.pi * np.cumsum(pitch) / ROOM_RATE
    voiced = sum(np.sin(k * phase) / k for k in range(1, 8)) * 0.5 * (1 - np.cos(2 * np.pi * 4 * t))
    return (voiced * 6000).astype(np.int16)


def test_an_utterance_encodes_to_two_20ms_packets_per_slice_and_decodes_back() -> None:
    audio = _speechy(1.2)
    slices = [audio[i:i + SLICE_SAMPLES] for i in range(0, audio.size, SLICE_SAMPLES)]
    encoder, decoder = OpusEncoder(), OpusDecoder()
    decoded = []
    for i, piece in enumerate(slices):
        payload = encoder.encode(piece) + (encoder.flush() if i == len(slices) - 1 else b"")
        assert len(unpack_packets(payload)) >= SLICE_SAMPLES // PACKET_SAMPLES
        frame = AudioFrame(room="r", seq=1, chunk=i, pts_us=0, sample_rate=ROOM_RATE, samples=SLICE_SAMPLES,
                           payload=payload, codec=CODEC_OPUS)
        decoded.append(decoder.decode(AudioFrame.decode(frame.encode()).payload))
    out = np.concatenate(decoded).astype(np.float64) / 32768
    assert abs(out.size - audio.size) <= PACKET_SAMPLES  # the flushed tail adds at most one packet
    # A perceptual codec keeps the loudness contour and the level, not the waveform: compare those,
    # after the codec's look-ahead (plus the decoder's resampling) is found.
    ref = audio.astype(np.float64)[: audio.size - 2 * PRE_SKIP_SAMPLES - 400] / 32768
    best = max(range(0, 2 * PRE_SKIP_SAMPLES + 400),
               key=lambda lag: float(np.corrcoef(ref, out[lag: lag + ref.size])[0, 1]))
    assert PRE_SKIP_SAMPLES // 2 <= best <= 2 * PRE_SKIP_SAMPLES + 200, best
    got = out[best: best + ref.size]
    assert np.corrcoef(frame_rms(ref, ROOM_RATE), frame_rms(got, ROOM_RATE))[0, 1] > 0.95
    assert abs(dbfs(rms(got)) - dbfs(rms(ref))) < 2.0


def test_opus_is_about_a_sixteenth_of_pcm() -> None:
    audio = _speechy(2.0)
    encoder = OpusEncoder(bitrate=24_000)
    size = sum(len(encoder.encode(audio[i:i + SLICE_SAMPLES])) for i in range(0, audio.size, SLICE_SAMPLES))
    assert size < audio.nbytes / 8


def test_opus_takes_only_its_own_rates() -> None:
    with pytest.raises(ValueError):
        OpusEncoder(sample_rate=22_050)
