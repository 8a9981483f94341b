"""Numbers as Mandarin words: ``105`` -> 一百零五, ``3.25`` -> 三点二五, ``2024`` (a year) -> 二零二四.

Pure functions over digit strings (ASCII); :mod:`workers.engines.zhtts.normalize` finds the
numbers in a line and says which reading each gets.
"""

from __future__ import annotations

from typing import Final

DIGITS: Final = "零一二三四五六七八九"
_SMALL_UNITS: Final = ("", "十", "百", "千")
_BIG_UNITS: Final = ("", "万", "亿", "万亿")
MAX_CARDINAL_DIGITS: Final = 16
"""Up to 9999 万亿; longer digit runs are read digit by digit."""


def digit_by_digit(digits: str) -> str:
    """``007`` -> 零零七 (codes, phone numbers, years)."""
    return "".join(DIGITS[int(d)] for d in digits)


def _group(value: int) -> str:
    """0 < ``value`` < 10000, with 零 for the zeros inside it (1005 -> 一千零五)."""
    out: list[str] = []
    zero = False
    for position in range(3, -1, -1):
        digit = value // 10 ** position % 10
        if digit == 0:
            zero = bool(out)
            continue
        if zero:
            out.append("零")
            zero = False
        out.append(DIGITS[digit] + _SMALL_UNITS[position])
    return "".join(out)


def cardinal(digits: str) -> str:
    """An integer's reading: ``0`` 零, ``10`` 十, ``15`` 十五, ``110`` 一百一十, ``20005`` 二万零五,
    ``100000000`` 一亿. Past :data:`MAX_CARDINAL_DIGITS` digits: digit by digit. Leading zeros are
    ignored (the caller reads ``007`` with :func:`digit_by_digit`)."""
    stripped = digits.lstrip("0")
    if not stripped:
        return DIGITS[0]
    if len(stripped) > MAX_CARDINAL_DIGITS:
        return digit_by_digit(digits)
    value = int(stripped)
    groups: list[int] = []
    while value:
        groups.append(value % 10_000)
        value //= 10_000
    out: list[str] = []
    zero = False
    for index in range(len(groups) - 1, -1, -1):
        group = groups[index]
        if group == 0:
            zero = bool(out)
            continue
        # A zero group between two others, or a group under 1000 after a higher one, is read 零.
        if out and (zero or group < 1000):
            out.append("零")
        zero = False
        out.append(_group(group) + _BIG_UNITS[index])
    text = "".join(out)
    # 10-19 at the head of a number are read without the 一: 十五, 十万, not 一十五.
    return text[1:] if text.startswith("一十") else text


def decimal(whole: str, fraction: str) -> str:
    """``3``, ``25`` -> 三点二五: the fraction digit by digit."""
    return f"{cardinal(whole)}点{digit_by_digit(fraction)}"
