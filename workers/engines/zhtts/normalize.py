"""A Mandarin line's numbers, dates, times and Latin letters as Chinese words, before pinyin.

The model reads Chinese syllables only: a digit or a letter that reached it would be dropped
(pypinyin has no reading for it). So before the pinyin step:

| written | read | rule |
|---|---|---|
| ``5号``, ``第3``, ``105`` | 五号, 第三, 一百零五 | an integer, as a quantity (up to 16 digits) |
| ``2个``, ``2名`` | 两个, 两名 | a lone 2 before a measure word (but 第2天: 第二天) |
| ``3.5``, ``-3``, ``1,000`` | 三点五, 负三, 一千 | decimals, a minus sign, thousands separators |
| ``2024年`` | 二零二四年 | four digits before 年: a year, digit by digit |
| ``007``, ``13812345678`` | 零零七, 一三八... | a leading zero, or nine digits and more: a code, digit by digit |
| ``2024-05-01``, ``2024/5/1``, ``2024.5.1`` | 二零二四年五月一日 | a date, year first (a valid month and day) |
| ``8:05``, ``20:30:15``, ``8:00`` | 八点零五分, 二十点三十分十五秒, 八点整 | a time |
| ``50%``, ``3‰`` | 百分之五十, 千分之三 | per cent, per mille |
| ``3-5``, ``3~5`` | 三到五 | a range between two numbers |
| ``1/2`` | 二分之一 | a fraction |
| ``¥5``, ``$5``, ``€5``, ``£5`` | 五元, 五美元, 五欧元, 五英镑 | a currency sign before a number |
| ``25℃``, ``25°C`` | 二十五摄氏度 | degrees Celsius |
| ``NPC``, ``OK`` | 恩皮西, 欧开 | Latin letters, each by its name as Chinese speakers say it |
| ``+``, ``=``, ``&`` | 加, 等于, 和 | a few symbols |

Full-width forms (``１２：３０``, ``ＮＰＣ``, ``５０％``) read as their ASCII twins.

**Not handled** (said as written, or dropped where the model has no sound for it): Latin words
are spelled letter by letter, never read as English (the model has no English sounds: put names
in the pronunciation lexicon); units other than ℃ and % (``5km``: 五 + the letters K, M);
phone numbers of eight digits or fewer are read as quantities; dates without a year (``5/1`` is
a fraction), or day first; Roman numerals, Greek letters, emoji and other symbols (silent);
the 两/二 choice anywhere but a lone 2 before a measure word (``2000`` is 二千).

Offsets: every character of the spoken text remembers the original character it reads
(:attr:`Spoken.origin`): the first word character of the stretch it replaced. So a word of the
line (``workers.engines.marks.split_words``) owns the spoken characters that point into it, and
word marks name the words as written.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from workers.engines.zhtts.numbers import cardinal, decimal, digit_by_digit

LETTERS: Final = dict(zip("ABCDEFGHIJKLMNOPQRSTUVWXYZ", (
    "诶", "必", "西", "迪", "伊", "艾弗", "吉", "艾尺", "艾", "杰", "开", "艾乐", "艾姆", "恩", "欧", "皮", "丘",
    "阿尔", "艾斯", "提", "优", "维", "达布溜", "艾克斯", "外", "贼德"), strict=True))
"""Each Latin letter as Chinese speakers name it, in characters whose reading pypinyin is sure of."""
MEASURE_WORDS: Final = frozenset("个名位只次天条张把本件种票人岁年条支队轮杯")
"""After a lone 2 these take 两 (两个人), not 二 (二号)."""
SYMBOLS: Final = {"+": "加", "=": "等于", "&": "和"}
CURRENCY: Final = {"¥": "元", "￥": "元", "$": "美元", "€": "欧元", "£": "英镑"}
CODE_DIGITS: Final = 9
"""A digit run this long (without separators) is a code or a phone number: digit by digit."""

_FULL_WIDTH: Final = {**{ord("０") + i: ord("0") + i for i in range(10)},
                      **{ord("Ａ") + i: ord("A") + i for i in range(26)},
                      **{ord("ａ") + i: ord("a") + i for i in range(26)},
                      **{ord(a): ord(b) for a, b in zip("％．／－＋＝＆～：", "%./-+=&~:", strict=True)}}
"""Full-width forms -> ASCII, one character for one, so offsets stay."""

_NUMBER = r"[0-9]+(?:\.[0-9]+)?"
_DATE: Final = re.compile(r"(?<![0-9])([0-9]{4})([-/.])([0-9]{1,2})\2([0-9]{1,2})(?![0-9])")
_TIME: Final = re.compile(r"(?<![0-9])([01]?[0-9]|2[0-3]):([0-5][0-9])(?::([0-5][0-9]))?(?![0-9:])")
_PERCENT: Final = re.compile(rf"([-−]?)({_NUMBER})\s?([%‰])")
_RANGE: Final = re.compile(rf"({_NUMBER})\s?[-~—–]\s?({_NUMBER})(?![0-9:-])")
_FRACTION: Final = re.compile(r"(?<![0-9/])([0-9]+)/([0-9]+)(?![0-9/])")
_CURRENCY: Final = re.compile(rf"([¥￥$€£])\s?({_NUMBER})")
_CELSIUS: Final = re.compile(rf"([-−]?)({_NUMBER})\s?(℃|°C)")
_INTEGER: Final = re.compile(r"([-−]?)([0-9]{1,3}(?:,[0-9]{3})+(?![0-9])|[0-9]+)(?:\.([0-9]+))?")
_LETTER_RUN: Final = re.compile(r"[A-Za-z]+")
_SYMBOL: Final = re.compile(r"[+=&]")
_ASCII_WORD: Final = re.compile(r"[0-9A-Za-z]")

Piece = tuple[int, int, str]
"""``text[start:end]`` is read as the string (``""``: silent); pieces lie in order, apart."""


@dataclass(frozen=True, slots=True)
class Spoken:
    """What the model is given for a line, and where each of its characters came from."""

    text: str
    origin: tuple[int, ...]
    """For each character of :attr:`text`, the offset in the original line of the character it
    reads (for a replaced stretch: its first word character)."""


def _minus(sign: str, at: int, text: str) -> str:
    """``-`` is a minus sign unless a Latin letter or a digit comes right before it (``A-3`` is a
    name; Chinese text before it is no such word: 温度-3℃ is 温度负三摄氏度)."""
    return "负" if sign and (at == 0 or not _ASCII_WORD.match(text[at - 1])) else ""


def _number(whole: str, fraction: str | None, text: str, start: int, end: int) -> str:
    if fraction is not None:
        return decimal(whole, fraction)
    if len(whole) > 1 and whole.startswith("0"):
        return digit_by_digit(whole)
    if len(whole) == 4 and text[end:end + 1] == "年":
        return digit_by_digit(whole)
    if len(whole) >= CODE_DIGITS:
        return digit_by_digit(whole)
    if whole == "2" and text[end:end + 1] in MEASURE_WORDS and text[start - 1:start] != "第":
        return "两"  # 两个人; but 第二天, an ordinal
    return cardinal(whole)


def _amount(match: re.Match[str], group: int) -> str:
    whole, _, fraction = match.group(group).partition(".")
    return decimal(whole, fraction) if fraction else cardinal(whole)


def _date(m: re.Match[str], text: str) -> list[Piece] | None:
    month, day = int(m.group(3)), int(m.group(4))
    if not (1 <= month <= 12 and 1 <= day <= 31):
        return None
    return [(m.start(1), m.end(1), digit_by_digit(m.group(1)) + "年"), (m.start(2), m.end(2), ""),
            (m.start(3), m.end(3), cardinal(m.group(3)) + "月"), (m.end(3), m.start(4), ""),
            (m.start(4), m.end(4), cardinal(m.group(4)) + "日")]


def _time(m: re.Match[str], text: str) -> list[Piece]:
    hour, minute, second = m.group(1), m.group(2), m.group(3)
    pieces: list[Piece] = [(m.start(1), m.end(1), cardinal(hour) + "点"), (m.end(1), m.start(2), "")]
    if minute == "00" and second is None:
        pieces.append((m.start(2), m.end(2), "整"))
    else:
        spoken = ("零" + cardinal(minute[1])) if minute.startswith("0") and minute != "00" else cardinal(minute)
        pieces.append((m.start(2), m.end(2), ("" if minute == "00" else spoken + "分")))
    if second is not None:
        pieces += [(m.end(2), m.start(3), ""), (m.start(3), m.end(3), cardinal(second) + "秒")]
    return pieces


def _percent(m: re.Match[str], text: str) -> list[Piece]:
    word = "百分之" if m.group(3) == "%" else "千分之"
    return [(m.start(), m.end(), _minus(m.group(1), m.start(), text) + word + _amount(m, 2))]


def _range(m: re.Match[str], text: str) -> list[Piece]:
    return [(m.start(1), m.end(1), _amount(m, 1)), (m.end(1), m.start(2), "到"), (m.start(2), m.end(2), _amount(m, 2))]


def _fraction(m: re.Match[str], text: str) -> list[Piece] | None:
    if int(m.group(2)) == 0:
        return None
    # Read denominator first: the whole fraction is one stretch, owned by the numerator's word.
    return [(m.start(), m.end(), f"{cardinal(m.group(2))}分之{cardinal(m.group(1))}")]


def _currency(m: re.Match[str], text: str) -> list[Piece]:
    return [(m.start(1), m.end(1), ""), (m.start(2), m.end(2), _amount(m, 2) + CURRENCY[m.group(1)])]


def _celsius(m: re.Match[str], text: str) -> list[Piece]:
    return [(m.start(), m.end(2), _minus(m.group(1), m.start(), text) + _amount(m, 2)),
            (m.end(2), m.end(), "摄氏度")]


def _integer(m: re.Match[str], text: str) -> list[Piece]:
    whole = m.group(2).replace(",", "")
    sign = _minus(m.group(1), m.start(), text)
    start = m.start() if sign else m.start(2)
    return [(start, m.end(), sign + _number(whole, m.group(3), text, m.start(2), m.end()))]


def _letters(m: re.Match[str], text: str) -> list[Piece]:
    return [(m.start(), m.end(), "".join(LETTERS[c] for c in m.group().upper()))]


def _symbol(m: re.Match[str], text: str) -> list[Piece]:
    return [(m.start(), m.end(), SYMBOLS[m.group()])]


Rule = Callable[[re.Match[str], str], list[Piece] | None]
_RULES: Final[tuple[tuple[re.Pattern[str], Rule], ...]] = (
    (_DATE, _date), (_TIME, _time), (_PERCENT, _percent), (_CELSIUS, _celsius), (_CURRENCY, _currency),
    (_RANGE, _range), (_FRACTION, _fraction), (_INTEGER, _integer), (_LETTER_RUN, _letters), (_SYMBOL, _symbol))
_STARTS: Final = re.compile(r"[0-9A-Za-z+=&¥￥$€£\-−]")


def pieces(text: str) -> list[Piece]:
    """Where ``text`` is rewritten, in order: at each place the first rule of :data:`_RULES` that
    matches there (and accepts the match) wins, and the scan goes on after it."""
    plain = text.translate(_FULL_WIDTH)
    out: list[Piece] = []
    pos = 0
    while (found := _STARTS.search(plain, pos)) is not None:
        pos = found.start()
        for pattern, rule in _RULES:
            m = pattern.match(plain, pos)
            if m is None or m.end() == pos:
                continue
            got = rule(m, plain)
            if got is not None:
                out.extend(p for p in got if p[1] > p[0])
                pos = m.end()
                break
        else:
            pos += 1
    return out


def normalize(text: str) -> Spoken:
    """``text`` as the model reads it (see the module's table), with each character's origin."""
    chars: list[str] = []
    origin: list[int] = []
    last = 0
    for start, end, spoken in pieces(text):
        chars.append(text[last:start])
        origin.extend(range(last, start))
        anchor = next((i for i in range(start, end) if text[i].isalnum()), start)
        chars.append(spoken)
        origin.extend([anchor] * len(spoken))
        last = end
    chars.append(text[last:])
    origin.extend(range(last, len(text)))
    return Spoken("".join(chars), tuple(origin))
