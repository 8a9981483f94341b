"""Language and dialect names as callers write them -> ISO 639-3 codes, as the catalog writes them.

``cantonese``, ``yue``, ``zh-yue``, ``zh-HK`` and ``粤语`` all become ``yue``; ``mandarin``, ``zh``,
``zh-CN``, ``zh-Hans`` and ``普通话`` become ``cmn``; ``en``, ``en-US`` and ``english`` become
``eng``. Matching is case-insensitive and accepts ``_`` for ``-``.

**Sichuanese.** ISO 639-3 has no code of its own for it: Sichuanese is a variety of Southwestern
Mandarin, which ISO files under ``cmn``. We keep the language strictly ISO 639-3 and carry the
variety as a *dialect*: ``sichuan``, ``sichuanese``, ``cmn-sichuan`` and ``四川话`` normalise to
``Language("cmn", dialect="sichuan")``, written ``cmn-sichuan`` where one string is needed (the
Linguist List's style of a private extension of an ISO code). So a catalog voice for Sichuanese
says ``"language": "cmn"`` and ``"tags": {"dialect": "sichuan"}``; a search for ``sichuan``
ranks it first and other Mandarin voices next (docs/voices.md).

Codes not in the tables are accepted when they have the shape of an ISO 639-3 code (three
letters), so a catalog may use any language without this module knowing it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from voxroom.errors import VoxroomError


class UnknownLanguage(VoxroomError, ValueError):
    """A language name or code that cannot be mapped to ISO 639-3."""


@dataclass(frozen=True, slots=True)
class Language:
    code: str
    """ISO 639-3."""
    dialect: str | None = None
    """A variety inside ``code`` that ISO 639-3 does not name (``sichuan``)."""

    def __str__(self) -> str:
        return f"{self.code}-{self.dialect}" if self.dialect else self.code

    @property
    def family(self) -> str:
        """The macrolanguage (``zho`` for Mandarin, Cantonese, Wu...), or the code itself."""
        return MACROLANGUAGE.get(self.code, self.code)


# ISO 639-1 -> ISO 639-3 for the languages voices are most often asked in. ``zh`` is the Chinese
# macrolanguage; callers who write it mean Mandarin.
_ISO1: Final = {
    "ar": "arb", "bn": "ben", "ca": "cat", "cs": "ces", "da": "dan", "de": "deu", "el": "ell", "en": "eng",
    "es": "spa", "fa": "pes", "fi": "fin", "fr": "fra", "he": "heb", "hi": "hin", "hu": "hun", "id": "ind",
    "it": "ita", "ja": "jpn", "ko": "kor", "ms": "zsm", "nl": "nld", "no": "nob", "nb": "nob", "pl": "pol",
    "pt": "por", "ro": "ron", "ru": "rus", "sv": "swe", "sw": "swh", "ta": "tam", "th": "tha", "tr": "tur",
    "uk": "ukr", "ur": "urd", "vi": "vie", "zh": "cmn",
}

_NAMES: Final = {
    "english": "eng", "french": "fra", "german": "deu", "spanish": "spa", "italian": "ita", "japanese": "jpn",
    "korean": "kor", "russian": "rus", "portuguese": "por", "arabic": "arb", "hindi": "hin", "dutch": "nld",
    "vietnamese": "vie", "thai": "tha", "turkish": "tur", "polish": "pol", "indonesian": "ind",
    "chinese": "cmn", "mandarin": "cmn", "putonghua": "cmn", "guoyu": "cmn", "普通话": "cmn", "国语": "cmn",
    "國語": "cmn", "中文": "cmn", "汉语": "cmn", "漢語": "cmn", "华语": "cmn",
    "cantonese": "yue", "guangdonghua": "yue", "粤语": "yue", "粵語": "yue", "广东话": "yue", "廣東話": "yue",
    "shanghainese": "wuu", "wu": "wuu", "上海话": "wuu", "吴语": "wuu",
    "hokkien": "nan", "minnan": "nan", "min-nan": "nan", "taiwanese": "nan", "闽南语": "nan", "台语": "nan",
    "hakka": "hak", "客家话": "hak",
}

# BCP 47 tags with a region or script that decides the variety.
_TAGS: Final = {
    "zh-yue": "yue", "zh-hk": "yue", "zh-mo": "yue", "zh-hant-hk": "yue", "yue-hk": "yue", "yue-hant": "yue",
    "zh-cn": "cmn", "zh-sg": "cmn", "zh-tw": "cmn", "zh-hans": "cmn", "zh-hant": "cmn", "zh-hans-cn": "cmn",
    "zh-hant-tw": "cmn", "zh-cmn": "cmn", "cmn-hans": "cmn", "cmn-hant": "cmn", "cmn-cn": "cmn", "cmn-tw": "cmn",
    "zh-wuu": "wuu", "zh-min-nan": "nan", "zh-nan": "nan", "zh-hak": "hak",
}

_SICHUAN: Final = Language("cmn", "sichuan")
_DIALECTS: Final = {
    "sichuan": _SICHUAN, "sichuanese": _SICHUAN, "sichuanhua": _SICHUAN, "szechuan": _SICHUAN,
    "szechuanese": _SICHUAN, "cmn-sichuan": _SICHUAN, "zh-sichuan": _SICHUAN, "cmn-x-sichuan": _SICHUAN,
    "四川话": _SICHUAN, "四川話": _SICHUAN, "川话": _SICHUAN,
}

MACROLANGUAGE: Final = {"cmn": "zho", "yue": "zho", "wuu": "zho", "nan": "zho", "hak": "zho", "zho": "zho",
                        "arb": "ara", "pes": "fas", "zsm": "msa", "nob": "nor", "swh": "swa"}

_ISO3_SHAPE: Final = re.compile(r"^[a-z]{3}$")
_SEPARATORS: Final = re.compile(r"[_\s]+")


def normalize_language(value: str) -> Language:
    """The ISO 639-3 language (and dialect) that ``value`` names. Raises :class:`UnknownLanguage`."""
    text = _SEPARATORS.sub("-", value.strip().lower()).strip("-")
    if not text:
        raise UnknownLanguage("empty language")
    if text in _DIALECTS:
        return _DIALECTS[text]
    for table in (_TAGS, _NAMES):
        if text in table:
            return Language(table[text])
    primary = text.partition("-")[0]
    if primary in _ISO1:
        return Language(_ISO1[primary])
    if primary == "zho":
        return Language("cmn")
    if _ISO3_SHAPE.match(primary):
        # A known dialect written after an ISO code (``cmn-sichuan``) was handled above; any other
        # subtag (a region, a script) does not change the language.
        return Language(primary)
    raise UnknownLanguage(f"unknown language {value[:40]!r}; use an ISO 639-3 code such as eng, cmn or yue")


def language_code(value: str) -> str:
    """Just the ISO 639-3 code (``sichuan`` -> ``cmn``). Raises :class:`UnknownLanguage`."""
    return normalize_language(value).code
