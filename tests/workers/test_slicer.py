"""Engine audio becomes whole 40 ms slices at 24 kHz, with no click at either end."""

from __future__ import annotations

import numpy as np

from voxroom.wire.protocol import ROOM_RATE, SLICE_SAMPLES
from workers.output.slicer import Slicer


def tone(rate: int, seconds: float, hz: float = 220.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return (0.5 * np.sin(2 * np.pi * hz * t)).astype(np.float32)


def run(slicer: Slicer, audio: np.ndarray, chunk: int) -> np.ndarray:
    out = []
    for i in range(0, audio.size, chunk):
        out += slicer.push(audio[i:i + chunk])
    out += slicer.flush()
    assert all(s.size == SLICE_SAMPLES and s.dtype == np.int16 for s in out)
    return np.concatenate(out).astype(np.float32) / 32767.0


def test_resampled_length_and_pitch_are_kept() -> None:
    src = tone(22050, 1.0, hz=440.0)
    out = run(Slicer(22050), src, chunk=1000)
    assert abs(out.size - ROOM_RATE) <= SLICE_SAMPLES  # padded to a whole slice at most
    spectrum = np.abs(np.fft.rfft(out[: ROOM_RATE]))
    peak_hz = np.argmax(spectrum) * ROOM_RATE / ROOM_RATE
    assert abs(peak_hz - 440.0) <= 2.0


def test_chunking_of_the_input_does_not_change_the_output() -> None:
    src = tone(16000, 0.73)
    a = run(Slicer(16000), src, chunk=160)
    b = run(Slicer(16000), src, chunk=5000)
    assert a.size == b.size
    assert np.max(np.abs(a - b)) < 1e-3


def test_ends_fade_and_padding_is_silence() -> None:
    src = np.full(ROOM_RATE // 2 + 100, 0.8, dtype=np.float32)  # a DC step: the worst case for a click
    out = run(Slicer(ROOM_RATE), src, chunk=777)
    assert abs(out[0]) < 0.01, "first sample must start from silence"
    assert np.max(np.abs(np.diff(out))) < 0.01, "no sample-to-sample step anywhere (fades at both ends)"
    assert np.all(out[src.size:] == 0), "padding is silence"
    assert out.size % SLICE_SAMPLES == 0
