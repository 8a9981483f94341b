"""Language names and codes as callers write them -> ISO 639-3."""

from __future__ import annotations

import pytest

from voxroom.voices.languages import Language, UnknownLanguage, language_code, normalize_language


@pytest.mark.parametrize("written", ["cantonese", "Cantonese", "yue", "zh-yue", "zh-HK", "zh_HK", "zh-Hant-HK",
                                     "粤语", "廣東話"])
def test_cantonese_spellings_are_yue(written: str) -> None:
    assert normalize_language(written) == Language("yue")


@pytest.mark.parametrize("written", ["mandarin", "zh", "zh-CN", "zh-Hans", "zh-TW", "cmn", "普通话", "Chinese"])
def test_mandarin_spellings_are_cmn(written: str) -> None:
    assert normalize_language(written) == Language("cmn")


@pytest.mark.parametrize("written", ["en", "en-US", "en_GB", "english", "ENG"])
def test_english_spellings_are_eng(written: str) -> None:
    assert language_code(written) == "eng"


@pytest.mark.parametrize("written", ["sichuan", "Sichuanese", "szechuan", "cmn-sichuan", "四川话"])
def test_sichuanese_is_mandarin_with_a_dialect(written: str) -> None:
    lang = normalize_language(written)
    assert lang == Language("cmn", "sichuan")
    assert str(lang) == "cmn-sichuan"
    assert lang.family == "zho"


def test_other_iso_codes_pass_through_and_two_letter_codes_map() -> None:
    assert language_code("fr-CA") == "fra"
    assert language_code("ja") == "jpn"
    assert language_code("tlh") == "tlh"  # any well-formed ISO 639-3 code is accepted
    assert language_code("shanghainese") == "wuu"
    assert normalize_language("yue").family == normalize_language("cmn").family == "zho"


@pytest.mark.parametrize("written", ["", "   ", "klingonese", "x1", "e"])
def test_unknown_languages_are_refused(written: str) -> None:
    with pytest.raises(UnknownLanguage):
        normalize_language(written)
