"""Voice mixes (voxroom/voices/mix.py): a mix of catalog voices exists for engines that blend
speaker embeddings (ChatTTS), under one canonical id, and is refused with its reason otherwise."""

from __future__ import annotations

import pytest

from voxroom.errors import UnknownVoice
from voxroom.voices import mix as voice_mix
from voxroom.voices.catalog import Catalog


@pytest.fixture(scope="module")
def catalog() -> Catalog:
    return Catalog.load()


def test_a_mix_of_chattts_voices_is_a_blend_under_its_canonical_id(catalog: Catalog) -> None:
    voice = catalog.get("eng-chattts-1111:2+chattts-narrator")
    assert voice.id == "eng-chattts-1111:2+chattts-narrator"
    assert voice.engine == "chattts" and voice.language == catalog.get("eng-chattts-1111").language
    assert voice.params == {"blend": [{"voice": "eng-chattts-1111", "weight": 2.0},
                                      {"voice": "chattts-narrator", "weight": 1.0}]}
    assert "eng-chattts-1111+cmn-chattts-2222" in catalog
    assert voice_mix.part_ids(voice.id) == ["eng-chattts-1111", "chattts-narrator"]


def test_kokoro_spelling_maps_to_the_canonical_id() -> None:
    parts = voice_mix.parse_kokoro("eng-chattts-1111(2) + cmn-chattts-2222(0.5)")
    assert parts == [("eng-chattts-1111", 2.0), ("cmn-chattts-2222", 0.5)]
    assert voice_mix.canonical(parts) == "eng-chattts-1111:2+cmn-chattts-2222:0.5"
    assert voice_mix.canonical([("a", 1.0), ("b", 1.0)]) == "a+b"


@pytest.mark.parametrize(("voice", "code", "reason"), [
    ("en-espeak+en-espeak-f", "voice_mix_unsupported", "cannot blend"),
    ("eng-chattts-1111+en-espeak", "voice_mix_unsupported", "different engines"),
    ("eng-chattts-1111+nobody", "unknown_voice", "unknown voice 'nobody'"),
    ("eng-chattts-1111:0+cmn-chattts-2222", "bad_message", "above 0"),
    ("eng-chattts-1111:500+cmn-chattts-2222", "bad_message", "at most"),
    ("eng-chattts-1111+eng-chattts-1111", "bad_message", "named twice"),
    ("a+b+c+d+e", "bad_message", "at most 4"),
    ("eng-chattts-1111++cmn-chattts-2222", "bad_message", "must read"),
])
def test_a_mix_that_cannot_be_spoken_is_refused_with_its_reason(catalog: Catalog, voice: str, code: str,
                                                                 reason: str) -> None:
    with pytest.raises(voice_mix.BadMix) as refused:
        catalog.get(voice)
    assert refused.value.code == code and reason in str(refused.value), str(refused.value)
    assert isinstance(refused.value, UnknownVoice), "every path that refuses unknown voices refuses it"
    assert voice not in catalog


def test_a_part_of_a_mix_is_never_itself_a_mix(catalog: Catalog) -> None:
    with pytest.raises(voice_mix.BadMix):
        catalog.get("eng-chattts-1111+cmn-chattts-2222:1+x")  # parses as three parts, the third unknown
    assert voice_mix.part_ids("plain-voice") == ["plain-voice"]
    assert voice_mix.part_ids("a++b") == []
