"""Voice mixes: a voice made of several catalog voices, for engines that blend speaker embeddings.

Two spellings name one:

- Kokoro-FastAPI's, on the OpenAI-compatible API: ``a+b`` (equal parts) or ``a(2)+b(1)``;
- voxroom's canonical id, which is also what a room's ``say`` may name and what ``start.voice``
  carries: ``a+b`` or ``a:2+b:1`` (``:`` and ``+`` are voice-id characters; parentheses are not).

A mix exists only for engines in :data:`BLENDING_ENGINES` (ChatTTS: a blend is the normalised
weighted sum of the parts' speaker embeddings, as a catalog ``blend`` voice is) and only of parts
spoken by the same engine. Anything else is refused with a clear reason, not spoken in some voice.
The worker builds the same :class:`~voxroom.voices.voice.Voice` from the id (``Catalog.get``), so a mix
needs no catalog entry and no state anywhere.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Final

from voxroom.errors import UnknownVoice
from voxroom.voices.voice import Voice

BLENDING_ENGINES: Final = frozenset({"chattts"})
MAX_PARTS: Final = 4
MAX_WEIGHT: Final = 100.0
_KOKORO_PART: Final = re.compile(r"^\s*([A-Za-z0-9_.\-]+)\s*(?:\(\s*(\d+(?:\.\d+)?)\s*\))?\s*$")
_CANONICAL_PART: Final = re.compile(r"^([A-Za-z0-9_.\-]+)(?::(\d+(?:\.\d+)?))?\Z")


class BadMix(UnknownVoice):
    """A mix that cannot be spoken: malformed, a part unknown, or no engine here blends its parts.
    A subclass of :class:`UnknownVoice`, so that every path that refuses an unknown voice refuses
    it too (a room's ``say`` answers ``unknown_voice`` with this message)."""

    def __init__(self, voice: str, reason: str, code: str = "voice_mix_unsupported") -> None:
        super().__init__(voice)
        self.args = (f"voice mix {voice[:64]!r}: {reason}",)
        self.reason = reason
        self.code = code
        """``bad_message`` (malformed), ``unknown_voice`` (a part) or ``voice_mix_unsupported``."""


def is_mix(name: str) -> bool:
    return "+" in name or "(" in name


def _weight(text: str | None, name: str) -> float:
    weight = 1.0 if text is None else float(text)
    if not 0.0 < weight <= MAX_WEIGHT:
        raise BadMix(name, f"weights are numbers above 0 and at most {MAX_WEIGHT:g}", "bad_message")
    return weight


def _split(name: str, part_re: re.Pattern[str], spelling: str) -> list[tuple[str, float]]:
    pieces = name.split("+")
    if len(pieces) > MAX_PARTS:
        raise BadMix(name, f"at most {MAX_PARTS} voices", "bad_message")
    parts = []
    for piece in pieces:
        found = part_re.match(piece)
        if found is None:
            raise BadMix(name, f"must read {spelling}", "bad_message")
        parts.append((found.group(1), _weight(found.group(2), name)))
    if len({voice for voice, _ in parts}) != len(parts):
        raise BadMix(name, "a voice is named twice", "bad_message")
    return parts


def parse_kokoro(name: str) -> list[tuple[str, float]]:
    """``a(2)+b(1)`` -> ``[("a", 2.0), ("b", 1.0)]``. Raises :class:`BadMix`."""
    return _split(name, _KOKORO_PART, "'a+b' or 'a(2)+b(1)'")


def canonical(parts: list[tuple[str, float]]) -> str:
    """The mix's voice id: ``a:2+b`` (a weight of 1 is left out)."""
    return "+".join(voice if weight == 1.0 else f"{voice}:{weight:g}" for voice, weight in parts)


def part_ids(name: str) -> list[str]:
    """The voice ids a mix id names (``[name]`` for a plain voice id, ``[]`` for a malformed mix):
    a mix is served where all of its parts are."""
    if "+" not in name:
        return [name]
    try:
        return [voice for voice, _ in _split(name, _CANONICAL_PART, "")]
    except BadMix:
        return []


def resolve(name: str, lookup: Callable[[str], Voice]) -> Voice:
    """The voice a canonical mix id names, its parts found by ``lookup`` (a catalog's own voices).
    Raises :class:`BadMix`."""
    parts = _split(name, _CANONICAL_PART, "'a+b' or 'a:2+b:1'")
    voices = []
    for voice_id, _ in parts:
        try:
            voices.append(lookup(voice_id))
        except UnknownVoice:
            raise BadMix(name, f"unknown voice {voice_id!r}", "unknown_voice") from None
    engines = {v.engine for v in voices}
    if len(engines) > 1:
        raise BadMix(name, f"its voices are spoken by different engines ({', '.join(sorted(engines))})")
    engine = voices[0].engine
    if engine not in BLENDING_ENGINES:
        raise BadMix(name, f"the {engine} engine cannot blend voices (blending engines: "
                           f"{', '.join(sorted(BLENDING_ENGINES))}): name one voice")
    return Voice(id=canonical(parts), engine=engine, language=voices[0].language,
                 name="mix of " + ", ".join(v.name or v.id for v in voices),
                 params={"blend": [{"voice": v.id, "weight": w} for v, (_, w) in zip(voices, parts, strict=True)]})
