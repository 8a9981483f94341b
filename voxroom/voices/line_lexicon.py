"""A line's own lexicon: the ``say`` field ``lexicon``, words respelled for that line only.

``{"Lupin": "Loo pan", "重庆": "虫庆"}``: the same entries as the deployment lexicon's file
(workers/engines/lexicon.py: case-aware, longest match first, whole Latin words, Chinese
anywhere), respellings only (no per-engine phonemes: only the deployment may write those), and
small, because it travels with every line through Redis and is part of the line's cache key:

- at most :data:`MAX_ENTRIES` entries (an empty object is no override);
- a key is 1-:data:`MAX_KEY_CHARS` code points, a respelling 1-:data:`MAX_VALUE_CHARS`, counted
  after trimming (runs of spaces inside a key count as one: the text may space a phrase freely);
- no control character, no ``[ ] < >`` in either (they would read as markup or as raw phonemes),
  no lone surrogate (not Unicode);
- no key twice (two lower-case keys that case-fold alike, ``Straße`` and ``strasse``, are one).

Pure (no I/O): the gateway validates with :func:`parse`, the job stream carries :func:`encode`'s
JSON, the worker reads it back with :func:`decode`, which applies the same rules.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Final

MAX_ENTRIES: Final = 16
MAX_KEY_CHARS: Final = 64
MAX_VALUE_CHARS: Final = 128
FORBIDDEN: Final = re.compile(r"[\x00-\x1f\x7f\[\]<>]")
"""Control characters, and brackets that would read as markup or as a phoneme block (shared
with the deployment lexicon's file)."""
_SURROGATE: Final = re.compile(r"[\ud800-\udfff]")


class BadLexicon(ValueError):
    """The override breaks a rule above; the message says which, for the client."""


def parse(value: object) -> dict[str, str]:
    """``value`` (a decoded JSON object or msgpack map; ``None``: none) as ``{key: respelling}``,
    keys with their inner whitespace collapsed, both trimmed. Raises :class:`BadLexicon`."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise BadLexicon("'lexicon' must be an object of words to respellings")
    if len(value) > MAX_ENTRIES:
        raise BadLexicon(f"'lexicon' has {len(value)} entries; at most {MAX_ENTRIES}")
    out: dict[str, str] = {}
    folded: set[str] = set()
    for raw_key, raw_value in value.items():
        key = _field("key", raw_key, MAX_KEY_CHARS)
        respelling = _field(f"respelling of {key[:40]!r}", raw_value, MAX_VALUE_CHARS)
        key = " ".join(key.split())
        same = key.casefold() if key == key.lower() else key
        if same in folded:
            raise BadLexicon(f"'lexicon' key {key[:40]!r} is given twice")
        folded.add(same)
        out[key] = respelling
    return out


def _field(name: str, value: object, limit: int) -> str:
    if not isinstance(value, str):
        raise BadLexicon(f"'lexicon' {name} must be a string")
    if _SURROGATE.search(value):
        raise BadLexicon(f"'lexicon' {name} holds a lone surrogate (not valid Unicode)")
    if FORBIDDEN.search(value):
        raise BadLexicon(f"'lexicon' {name} {value[:40]!r} holds a bracket, an angle or a control character")
    value = value.strip()
    if not 1 <= len(value) <= limit:
        raise BadLexicon(f"'lexicon' {name} must be 1-{limit} characters")
    return value


def encode(entries: Mapping[str, str]) -> str:
    """The job stream's form: compact JSON, keys sorted (``""`` for none)."""
    if not entries:
        return ""
    return json.dumps(dict(entries), ensure_ascii=False, sort_keys=True, separators=(",", ":"))


def decode(raw: str) -> dict[str, str]:
    """:func:`encode`'s output back (``""``: none). Raises :class:`BadLexicon` (a ``ValueError``)
    for anything :func:`parse` would refuse, JSON that is not JSON included."""
    if not raw:
        return {}
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise BadLexicon(f"'lexicon' is not JSON: {exc}") from None
    return parse(value)
