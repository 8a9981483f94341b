"""The Mandarin espeak-ng voices speak at the settings tuned with bench/mandarin_cer.py.

Before tuning they spoke at espeak-ng's defaults (175 words per minute, pitch 50); docs/voices.md
has the recognizer's character error rates before and after. Here, no recognizer: the catalog
voice's real audio is compared with the same voice at the old settings. espeak-ng's durations
(silences at punctuation included) scale with 1/rate, a little more at slow rates (measured:
x1.66 at 110 where 175/110 is 1.59, x1.28 at 140 where 175/140 is 1.25).
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from tests.support.engines import synthesize, voice_with
from voxroom.voices.catalog import Catalog
from workers.engines.espeak import EspeakEngine

LINE = "天黑请闭眼，狼人请睁眼。今晚你们要杀谁？"  # Chinese punctuation on purpose
BEFORE = {"rate": 175, "pitch": 50}
"""What every Mandarin voice used before tuning: espeak-ng's defaults."""


def median_f0(x: npt.NDArray[np.float32], rate: int, low_hz: float = 60.0, high_hz: float = 400.0) -> float:
    """Median fundamental frequency of the loud, periodic 40 ms frames (autocorrelation peak)."""
    frame, peak = int(0.04 * rate), float(np.max(np.abs(x)))
    shortest, longest = int(rate / high_hz), int(rate / low_hz)
    found = []
    for start in range(0, x.size - frame, frame // 2):
        w = x[start:start + frame].astype(np.float64)
        if np.sqrt(np.mean(w ** 2)) < 0.1 * peak:
            continue
        w -= w.mean()
        ac = np.correlate(w, w, "full")[frame - 1:]
        lag = shortest + int(np.argmax(ac[shortest:longest]))
        if ac[lag] > 0.5 * ac[0]:  # periodic: a voiced frame
            found.append(rate / lag)
    assert len(found) >= 20, len(found)
    return float(np.median(found))


@pytest.mark.parametrize(("voice_id", "rate"), [("cmn-espeak", 110), ("cmn-espeak-f", 140)])
def test_speaks_slower_by_the_tuned_rate(espeak: EspeakEngine, catalog: Catalog, voice_id: str, rate: int) -> None:
    voice = catalog.get(voice_id)
    tuned = synthesize(espeak, voice, LINE)
    before = synthesize(espeak, voice_with(voice, **BEFORE), LINE)
    expected = BEFORE["rate"] / rate
    ratio = tuned.seconds / before.seconds
    assert 0.97 * expected <= ratio <= 1.12 * expected, (ratio, expected, tuned.seconds, before.seconds)


def test_male_voice_speaks_lower(espeak: EspeakEngine, catalog: Catalog) -> None:
    """Pitch 35 instead of 50: about 13 % lower (measured 77 Hz against 88 Hz)."""
    voice = catalog.get("cmn-espeak")
    tuned = synthesize(espeak, voice, LINE)
    before = synthesize(espeak, voice_with(voice, pitch=BEFORE["pitch"]), LINE)
    ratio = median_f0(tuned.audio, tuned.rate) / median_f0(before.audio, before.rate)
    assert 0.80 <= ratio <= 0.94, ratio
