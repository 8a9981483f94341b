"""Audio checks for tests: is this speech, how long is it, does it click?

Pure numpy, mono float arrays in [-1, 1]. Import it from any test::

    from tests.support.audio import is_speech_like, max_jump

    verdict = is_speech_like(audio, 22_050)
    assert verdict, verdict.reason

The thresholds were set on the real engines (Piper, espeak-ng in English, Mandarin and
Cantonese) against silence, sine tones and white noise; ``tests/support/test_audio.py`` proves
the separation.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

Audio = npt.NDArray[np.floating]

SILENCE_DBFS = -45.0
"""Below this RMS a signal counts as silence (quiet speech sits around -30 to -15 dBFS)."""


def _f64(x: Audio) -> npt.NDArray[np.float64]:
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 1:
        raise ValueError(f"mono audio expected, got shape {a.shape}")
    return a


def rms(x: Audio) -> float:
    """Root mean square; 0.0 for an empty array."""
    a = _f64(x)
    return float(np.sqrt(np.mean(a * a))) if a.size else 0.0


def dbfs(value: float) -> float:
    """An amplitude (RMS or peak) in dB relative to full scale; -inf for 0."""
    return float(20 * np.log10(value)) if value > 0 else float("-inf")


def duration_s(x: Audio, rate: int) -> float:
    return len(x) / rate


def frame_rms(x: Audio, rate: int, frame_ms: float = 20.0, hop_ms: float = 10.0) -> npt.NDArray[np.float64]:
    """RMS of each frame: the energy envelope, one value per ``hop_ms``."""
    a = _f64(x)
    frame, hop = max(1, int(rate * frame_ms / 1000)), max(1, int(rate * hop_ms / 1000))
    if a.size < frame:
        return np.array([rms(a)])
    starts = np.arange(0, a.size - frame + 1, hop)
    squares = np.concatenate(([0.0], np.cumsum(a * a)))
    return np.sqrt((squares[starts + frame] - squares[starts]) / frame)


def voiced_duration_s(x: Audio, rate: int, below_peak_db: float = 35.0) -> float:
    """Time from the first to the last frame within ``below_peak_db`` of the loudest frame:
    the utterance without its leading and trailing silence."""
    env = frame_rms(x, rate)
    if env.max() <= 0:
        return 0.0
    loud = np.flatnonzero(env >= env.max() * 10 ** (-below_peak_db / 20))
    return float((loud[-1] - loud[0] + 1) * 0.010)


def spectral_flatness(x: Audio, frame: int = 1024) -> float:
    """Wiener entropy of the average power spectrum: geometric / arithmetic mean, in [0, 1].

    About 1 for white noise, near 0 for a pure tone (one bin holds the energy); speech, whose
    energy sits in harmonics and formants below ~4 kHz, is in between (0.001-0.2).
    """
    a = _f64(x)
    if a.size < frame:
        frame = max(16, a.size)
        a = np.pad(a, (0, frame - a.size))
    hop = frame // 2
    starts = range(0, a.size - frame + 1, hop)
    window = np.hanning(frame)
    power = np.mean([np.abs(np.fft.rfft(a[s:s + frame] * window)) ** 2 for s in starts], axis=0)[1:]
    power = power + 1e-20  # log of an exact zero (digital silence) would be -inf
    return float(np.exp(np.mean(np.log(power))) / np.mean(power))


def syllable_modulation(x: Audio, rate: int, band_hz: tuple[float, float] = (2.0, 8.0)) -> float:
    """Depth of the energy envelope's modulation at syllable rate (2-8 Hz), relative to its mean.

    Speech opens and closes about 3-6 times a second, so its envelope swings by 50-100 % of its
    mean in that band; a steady tone or noise stays within a few percent.
    """
    env = frame_rms(x, rate)  # 100 envelope values per second
    mean = env.mean()
    if env.size < 8 or mean <= 0:
        return 0.0
    spectrum = np.fft.rfft(env - mean)
    freqs = np.fft.rfftfreq(env.size, d=0.010)
    in_band = (freqs >= band_hz[0]) & (freqs <= band_hz[1])
    # Parseval: the RMS of the band-limited envelope, from its one-sided spectrum.
    band_rms = np.sqrt(2 * np.sum(np.abs(spectrum[in_band]) ** 2)) / env.size
    return float(band_rms / mean)


def zero_crossing_rate(x: Audio, rate: int) -> float:
    """Sign changes per second."""
    a = _f64(x)
    return float(np.count_nonzero(np.diff(np.signbit(a)))) * rate / max(1, a.size)


def jump_ratios(x: Audio, rate: int, window_ms: float = 5.0) -> npt.NDArray[np.float64]:
    """For each step ``x[n+1] - x[n]``: its size over the RMS of the other steps within
    ``window_ms`` (the step itself left out, so that a lone spike cannot hide in its own
    average). The RMS is floored at 0.3 times the whole signal's step RMS so that near-silent
    stretches, where any step is "large" relative to its tiny neighbours, do not count."""
    a = _f64(x)
    if a.size < 3:
        return np.zeros(max(0, a.size - 1))
    steps = np.abs(np.diff(a))
    half = max(1, int(rate * window_ms / 1000))
    squares = np.concatenate(([0.0], np.cumsum(steps * steps)))
    idx = np.arange(steps.size)
    lo, hi = np.maximum(idx - half, 0), np.minimum(idx + half + 1, steps.size)
    others = np.maximum(squares[hi] - squares[lo] - steps * steps, 0.0) / np.maximum(hi - lo - 1, 1)
    floor = max(0.3 * float(np.sqrt(np.mean(steps * steps))), 1e-9)
    ratios: npt.NDArray[np.float64] = steps / np.maximum(np.sqrt(others), floor)
    return ratios


CLICK_RATIO = 12.0
"""A :func:`max_jump` above this is a click. Measured at 22.05 kHz: Piper and espeak speech 6-9.2,
white noise ~4.5, a sine ~1.4; a 10 ms dropout at the loudest sample of speech 15-21, a sine's
phase jump 13-25. Speech is full of sharp glottal pulses, so in speech this catches gross
discontinuities only; pass ``at=`` (the chunk joins) to look at the joins alone."""


def max_jump(x: Audio, rate: int, *, at: npt.ArrayLike | None = None) -> float:
    """The largest :func:`jump_ratios` value: above :data:`CLICK_RATIO` means a click.

    ``at``: only the steps that start at these sample indices, e.g. the last sample of each
    chunk, to ask whether the *joins* between chunks click rather than the audio itself.
    """
    ratios = jump_ratios(x, rate)
    if at is not None:
        where = np.asarray(at, dtype=np.int64)
        ratios = ratios[where[(where >= 0) & (where < ratios.size)]]
    return float(ratios.max()) if ratios.size else 0.0


@dataclass(frozen=True, slots=True)
class SpeechVerdict:
    """Truthy when the audio looks like speech; ``reason`` says why (or why not)."""

    speech: bool
    reason: str
    rms_dbfs: float
    flatness: float
    modulation: float

    def __bool__(self) -> bool:
        return self.speech


def is_speech_like(x: Audio, rate: int, *, min_seconds: float = 0.5) -> SpeechVerdict:
    """Is ``x`` plausibly speech? Checks, in order:

    1. at least ``min_seconds`` long;
    2. loud enough: RMS above :data:`SILENCE_DBFS`;
    3. not noise: spectral flatness below 0.3 (white noise is ~1);
    4. not a pure tone: spectral flatness above 1e-4 (a sine is ~1e-6 or less);
    5. syllables: energy envelope modulated by at least 20 % at 2-8 Hz (steady sounds: < 5 %).
    """
    seconds = duration_s(x, rate)
    level = dbfs(rms(x))
    flat = spectral_flatness(x) if len(x) else 1.0
    mod = syllable_modulation(x, rate)

    def verdict(ok: bool, why: str) -> SpeechVerdict:
        facts = f"({seconds:.2f} s, {level:.1f} dBFS, flatness {flat:.2g}, modulation {mod:.2f})"
        return SpeechVerdict(ok, f"{why} {facts}", level, flat, mod)

    if seconds < min_seconds:
        return verdict(False, f"too short for a judgement (< {min_seconds} s)")
    if level < SILENCE_DBFS:
        return verdict(False, "silence")
    if flat > 0.3:
        return verdict(False, "noise-like spectrum")
    if flat < 1e-4:
        return verdict(False, "tone-like spectrum")
    if mod < 0.2:
        return verdict(False, "no syllable-rate modulation")
    return verdict(True, "speech-like")
