"""Incremental decoding: GPT hidden states in, audio out, each sample decoded a bounded number of times.

Upstream re-decodes the whole prefix (decoder + Vocos) for every 24-step slice, so decoding an utterance
of N steps costs O(N^2) and nothing comes out before step 72. Here every emission decodes only a window:

    |<- left context ->|<--- new audio --->|<- holdback ->|
    s0                 E                   target         T (steps generated so far)

* ``left_context_steps`` of already-emitted steps are re-decoded so that the convolutions see real
  context instead of zero padding (their output there is discarded);
* the last ``holdback_steps`` are decoded but not emitted yet: without their right context they would
  differ from a full decode. The next emission decodes them again with context;
* the first ``overlap`` samples past ``target`` are kept as a provisional tail and crossfaded (raised
  cosine, gains summing to 1) into the next emission, so consecutive windows join without a step.

Each step is decoded about ``1 + (left_context + holdback) / chunk`` times instead of ``N / 48`` on average
upstream. One GPT step is 512 samples at 24 kHz (2 mel frames of 256).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
import torch

Pcm = npt.NDArray[np.float32]
SAMPLES_PER_STEP = 512
HALF_FRAME = 256  # Vocos with center padding returns 512*T - 256 samples for T steps


@dataclass(frozen=True, slots=True)
class StreamConfig:
    first_chunk_steps: int = 8
    """Audio steps in the first emission: it goes out after ``first_chunk_steps + holdback_steps``
    GPT steps (16 by default, vs 72 upstream)."""
    chunk_steps: int = 24
    """Audio steps per later emission (0.51 s)."""
    left_context_steps: int = 16
    holdback_steps: int = 8
    """Right context: 8 steps (170 ms) brings the windowed decode within 3e-5 of a full decode on the
    tiny model, 4 steps only within 5e-3 (measured, tests/chattts/test_streaming.py)."""
    overlap_samples: int = 1024
    """Crossfade length (43 ms); must be at most ``holdback_steps * 512``."""

    def __post_init__(self) -> None:
        if self.overlap_samples > self.holdback_steps * SAMPLES_PER_STEP:
            raise ValueError("overlap_samples must fit inside the holdback")
        if min(self.first_chunk_steps, self.chunk_steps) < 1:
            raise ValueError("chunk sizes must be positive")


DecodeFn = Callable[[torch.Tensor], Pcm]
"""Hidden states ``(T, H)`` -> audio of ``512*T - 256`` samples (decoder + Vocos)."""


class IncrementalDecoder:
    """One row's streaming decoder. Feed it the row's growing list of hidden states."""

    def __init__(self, decode: DecodeFn, config: StreamConfig) -> None:
        self.decode = decode
        self.config = config
        self.emitted = 0  # absolute samples already returned
        self.tail: Pcm | None = None  # provisional samples [emitted, emitted + overlap)
        self.decoded_steps = 0  # steps pushed through the decoder, for the benchmarks

    def ready(self, steps: int) -> bool:
        """Whether ``steps`` generated steps justify an emission now."""
        c = self.config
        target = (steps - c.holdback_steps) * SAMPLES_PER_STEP
        need = (c.first_chunk_steps if self.emitted == 0 else c.chunk_steps) * SAMPLES_PER_STEP
        return target - self.emitted >= need

    def emit(self, hiddens: list[torch.Tensor], final: bool) -> Pcm:
        """Audio from ``emitted`` up to the holdback (or to the end when ``final``)."""
        c = self.config
        steps = len(hiddens)
        if steps == 0:
            return np.zeros(0, np.float32)
        end = steps * SAMPLES_PER_STEP - HALF_FRAME if final else (steps - c.holdback_steps) * SAMPLES_PER_STEP
        if end <= self.emitted:
            return np.zeros(0, np.float32)
        s0 = max(0, self.emitted // SAMPLES_PER_STEP - c.left_context_steps)
        window = torch.stack(hiddens[s0:steps])
        wav = self.decode(window)
        self.decoded_steps += steps - s0
        a0 = s0 * SAMPLES_PER_STEP
        new = wav[self.emitted - a0:end - a0].copy()
        if self.tail is not None:
            n = min(len(self.tail), len(new))
            fade_in = _raised_cosine(n)
            new[:n] = new[:n] * fade_in + self.tail[:n] * (1.0 - fade_in)
        self.tail = None if final else wav[end - a0:end - a0 + c.overlap_samples].copy()
        self.emitted = end
        return new

    def flush_tail(self, fade_samples: int) -> Pcm:
        """On cancel: the provisional tail, faded out, so that the stream ends without a click."""
        if self.tail is None:
            return np.zeros(0, np.float32)
        tail = self.tail[:fade_samples].copy()
        tail *= 1.0 - _raised_cosine(len(tail))
        self.tail = None
        self.emitted += len(tail)
        return tail


def _raised_cosine(n: int) -> npt.NDArray[np.float32]:
    """0 -> 1 over ``n`` samples; ``f + (1 - f)`` is 1 everywhere, so equal signals pass unchanged."""
    if n <= 0:
        return np.zeros(0, np.float32)
    t = (np.arange(n, dtype=np.float32) + 0.5) / n
    return (0.5 - 0.5 * np.cos(np.pi * t)).astype(np.float32)


class Fader:
    """Fade in at the start and out at the end of a piece, by absolute sample position, whatever the
    chunking (``fade_samples`` = 80 ms by default): every boundary between pieces, voices and utterances
    starts and ends at zero, so nothing clicks however the pieces differ."""

    def __init__(self, fade_samples: int) -> None:
        self.n = fade_samples
        self.pos = 0
        self.ramp = _raised_cosine(fade_samples)

    def apply(self, chunk: Pcm, final: bool) -> Pcm:
        out = chunk.astype(np.float32, copy=True)
        if self.pos < self.n and self.n:
            k = min(self.n - self.pos, len(out))
            out[:k] *= self.ramp[self.pos:self.pos + k]
        if final and self.n:
            k = min(self.n, len(out))
            out[len(out) - k:] *= self.ramp[:k][::-1]
        self.pos += len(out)
        return out
