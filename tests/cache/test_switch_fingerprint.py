"""The audio cache key of a line in a voice switch spread over several lines: each part of the
switch is its own entry, never the plain voice's."""

from __future__ import annotations

from voxroom.voices.catalog import Voice
from workers.audio_cache.cache import fingerprint

A = Voice("a", "chattts", "eng", params={"seed": 11})
B = Voice("b", "chattts", "eng", params={"seed": 22})


def _fp(**switch: object) -> str:
    return fingerprint(engine="chattts", model_version="", engine_rate=24000, voice=B, text="Good evening.",
                       **switch)  # type: ignore[arg-type]


def test_each_part_of_a_switch_has_its_own_key() -> None:
    plain = _fp()
    parts = [_fp(previous_voice=A, switch_range=(k / 3, (k + 1) / 3)) for k in range(3)]
    whole = _fp(previous_voice=A)
    assert len({plain, whole, *parts}) == 5  # the last third ends on B but was not spoken as B
    assert _fp(previous_voice=A, switch_range=(1 / 3, 2 / 3)) == parts[1]
    assert whole == _fp(previous_voice=A, switch_range=(0.0, 1.0))
    # Without a switch the range means nothing: the plain line's entry.
    assert _fp(switch_range=(0.0, 1 / 3)) == plain
    assert _fp(previous_voice=B, switch_range=(0.0, 1 / 3)) == plain
