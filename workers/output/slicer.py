"""Engine audio -> fixed room slices: resample to the room rate, cut into 40 ms int16 slices.

Engines speak at their own rates (Piper 22.05 kHz, espeak 22.05 kHz, ChatTTS 24 kHz). Every room
plays at :data:`voxroom.wire.protocol.ROOM_RATE`, so the worker resamples with soxr (streaming, so the
first slice leaves as soon as the engine's first chunk does) and re-slices into equal slices that
the client's jitter buffer can schedule one by one.

Boundaries never click: the first slice of an utterance fades in and the last fades out (a few
milliseconds, below what the ear hears as an attack change), and the last slice is padded with
silence to a full slice.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import soxr

from voxroom.wire.protocol import ROOM_RATE, SLICE_SAMPLES

Slice = npt.NDArray[np.int16]
FADE_MS = 5.0


class Slicer:
    """Stateful, one per utterance. Not thread-safe (one utterance is one thread's business)."""

    def __init__(self, in_rate: int, *, out_rate: int = ROOM_RATE, slice_samples: int = SLICE_SAMPLES,
                 fade_ms: float = FADE_MS) -> None:
        self.out_rate = out_rate
        self.slice_samples = slice_samples
        self._resampler = (soxr.ResampleStream(in_rate, out_rate, 1, dtype="float32", quality="HQ")
                           if in_rate != out_rate else None)
        self._pending = np.zeros(0, dtype=np.float32)
        self._fade = max(1, int(out_rate * fade_ms / 1000))
        self._emitted = 0
        self.total_samples = 0
        """Samples of real audio (before the final padding)."""

    def push(self, pcm: npt.NDArray[np.float32]) -> list[Slice]:
        """Feed engine samples (float32 mono, engine rate); get back the slices now complete."""
        data = np.asarray(pcm, dtype=np.float32).reshape(-1)
        if self._resampler is not None:
            data = self._resampler.resample_chunk(data, last=False)
        return self._take(data, last=False)

    def flush(self) -> list[Slice]:
        """End of utterance: the rest, padded to a whole slice, faded out."""
        tail = np.zeros(0, dtype=np.float32)
        if self._resampler is not None:
            tail = self._resampler.resample_chunk(tail, last=True)
        return self._take(tail, last=True)

    def _take(self, data: npt.NDArray[np.float32], *, last: bool) -> list[Slice]:
        buf = np.concatenate([self._pending, data]) if self._pending.size else data
        self.total_samples += data.size
        n_full = buf.size // self.slice_samples
        if last:
            if buf.size % self.slice_samples or buf.size == 0:
                pad = self.slice_samples - buf.size % self.slice_samples
                buf = np.concatenate([buf, np.zeros(pad, dtype=np.float32)])
            n_full = buf.size // self.slice_samples
            if buf.size:
                real = min(self.total_samples - self._emitted, buf.size)
                fade = min(self._fade, real)
                if fade > 0:
                    buf[real - fade:real] *= np.linspace(1.0, 0.0, fade, dtype=np.float32)
        cut = n_full * self.slice_samples
        out, self._pending = buf[:cut], buf[cut:].copy()
        if self._emitted == 0 and out.size:
            fade = min(self._fade, out.size)
            out = out.copy()
            out[:fade] *= np.linspace(0.0, 1.0, fade, dtype=np.float32)
        self._emitted += out.size
        ints = np.clip(np.round(out * 32767.0), -32768, 32767).astype(np.int16)
        return [ints[i:i + self.slice_samples] for i in range(0, cut, self.slice_samples)]
