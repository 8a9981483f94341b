"""A deployment's pronunciation lexicon: words and phrases -> how to say them.

``VOXROOM_LEXICON`` names a UTF-8 file, one entry a line, fields separated by tabs::

    # word or phrase   respelling          optional per-engine phonemes
    Lupin              Loo pan             espeak=l'u:p@n    piper=lˈuːpən
    Seer               Seeer
    NASA               Nasa
    重庆                 虫庆

- **Case-aware**: an all-lower-case key matches any case (``seer`` finds ``Seer``, ``SEER``); a key
  with a capital matches only as written (``US`` is not ``us``).
- **Longest match first**, left to right, and a match never starts or ends inside a Latin word
  (``Seer`` leaves ``Seers`` alone). Chinese has no spaces between words, so Chinese keys match
  anywhere.
- ``engine=phonemes`` (a field after the respelling) is used instead of the respelling by that
  engine: espeak-ng's phoneme mnemonics, Piper's IPA, both given to the engine as ``[[...]]``.

A bad file is refused at start (:class:`ConfigError` naming the file and line): a line without a
respelling, a duplicate key, a field with markup or control characters, an unknown engine, more
than :data:`MAX_ENTRIES` entries. :attr:`Lexicon.version` is a hash of the entries: the engine
wrapper puts it into ``model_version``, which is part of the audio cache key, so a changed lexicon
never serves audio cached under the old one.

A line may carry its own few entries (``say``'s ``lexicon``, bounded by voxroom/voices/line_lexicon.py):
:func:`for_line` makes them a small :class:`Lexicon`, and :meth:`Lexicon.apply_spans` applies it
over the deployment's in one left-to-right pass, by the same rules: the leftmost match, at one
place the longest, and where both lexicons match the same words the line's own entry wins. The
line's entries are part of that line's cache key (workers/audio_cache/cache.py), not of ``version``.
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from voxroom.errors import ConfigError
from voxroom.voices import line_lexicon
from workers.engines.marks import Rewrite

MAX_ENTRIES: Final = 10_000
MAX_KEY_CHARS: Final = 64
MAX_VALUE_CHARS: Final = 256
PHONEME_ENGINES: Final = ("espeak", "piper")
"""Engines that read ``[[phonemes]]`` inline (espeak-ng mnemonics; Piper IPA)."""

_FORBIDDEN: Final = line_lexicon.FORBIDDEN
"""Control characters, and brackets that would read as markup or as a phoneme block."""
_NOT_WORD: Final = r"[^\W\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002fa1f]"
"""A word character that is not CJK: what a Latin-script key must not touch at either end."""


@dataclass(frozen=True, slots=True)
class Entry:
    key: str
    respelling: str
    phonemes: Mapping[str, str] = field(default_factory=dict)

    @property
    def any_case(self) -> bool:
        return self.key == self.key.lower()


class Lexicon:
    """Immutable once built; :meth:`apply` is safe from any thread."""

    def __init__(self, entries: Iterable[Entry]) -> None:
        self.entries = tuple(entries)
        self._exact = {e.key: e for e in self.entries if not e.any_case}
        self._folded = {e.key.casefold(): e for e in self.entries if e.any_case}
        material = json.dumps([[e.key, e.respelling, sorted(e.phonemes.items())] for e in self.entries],
                              ensure_ascii=False, sort_keys=True)
        self.version = hashlib.sha256(material.encode("utf-8")).hexdigest()[:16] if self.entries else ""
        """Changes whenever any entry changes; empty for an empty lexicon."""
        # Longest first so that the alternation tries "Werewolf King" before "Werewolf"; at one
        # length, exact-case keys before any-case ones.
        ordered = sorted(self.entries, key=lambda e: (-len(e.key), e.any_case))
        self._pattern = (re.compile("|".join(_alternative(e) for e in ordered)) if ordered else None)

    def __len__(self) -> int:
        return len(self.entries)

    def apply(self, text: str, engine: str = "") -> str:
        """``text`` with every entry replaced by its respelling (or by ``engine``'s phonemes)."""
        return self.apply_spans(text, engine)[0]

    def apply_spans(self, text: str, engine: str = "", override: Lexicon | None = None) -> tuple[str, list[Rewrite]]:
        """:meth:`apply`, and where each replacement went: word timings of the respelled text
        are mapped back to the words as written (``workers.engines.marks.map_back``).
        ``override``: a line's own entries (:func:`for_line`), applied in the same pass; where
        it matches the same words as this lexicon, its entry wins."""
        lexicons = [lex for lex in (override, self) if lex is not None and lex._pattern is not None]
        if not lexicons:
            return text, []
        out: list[str] = []
        rewrites: list[Rewrite] = []
        last = size = 0
        for lexicon, found in _matches(text, lexicons):
            word = " ".join(found.group().split())  # a phrase may be spread over any whitespace
            entry = lexicon._exact.get(word) or lexicon._folded.get(word.casefold())
            if entry is None:  # unreachable: every alternative is a key of one of the maps
                continue
            phonemes = entry.phonemes.get(engine)
            spoken = f"[[{phonemes}]]" if phonemes else entry.respelling
            out.append(text[last:found.start()])
            size += found.start() - last
            rewrites.append(Rewrite(found.start(), found.end() - found.start(), size, len(spoken)))
            out.append(spoken)
            size += len(spoken)
            last = found.end()
        out.append(text[last:])
        return "".join(out), rewrites

    @classmethod
    def from_text(cls, text: str, source: str = "lexicon") -> Lexicon:
        """Parse the TSV format above. Raises :class:`ConfigError` with ``source:line``."""
        entries: list[Entry] = []
        seen: dict[str, int] = {}
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue

            def bad(why: str, at: int = number) -> ConfigError:
                return ConfigError(f"{source}:{at}: {why}")

            fields = [f.strip() for f in raw.split("\t") if f.strip()]
            if len(fields) < 2:
                raise bad("expected a word or phrase, a tab, and its respelling")
            key, respelling, *extra = fields
            if respelling.partition("=")[0].strip() in PHONEME_ENGINES:
                raise bad("expected a respelling before the engine=phonemes fields")
            key = " ".join(key.split())
            for name, value, limit in (("key", key, MAX_KEY_CHARS), ("respelling", respelling, MAX_VALUE_CHARS)):
                if len(value) > limit:
                    raise bad(f"{name} longer than {limit} characters")
                if _FORBIDDEN.search(value):
                    raise bad(f"{name} {value[:40]!r} holds a bracket, an angle or a control character")
            phonemes: dict[str, str] = {}
            for item in extra:
                engine, sep, value = item.partition("=")
                engine, value = engine.strip(), value.strip()
                if not sep or engine not in PHONEME_ENGINES or not value:
                    raise bad(f"field {item[:40]!r} is not engine=phonemes (engines: {', '.join(PHONEME_ENGINES)})")
                if len(value) > MAX_VALUE_CHARS or _FORBIDDEN.search(value):
                    raise bad(f"phonemes for {engine} are too long or hold a bracket or control character")
                phonemes[engine] = value
            folded = key.casefold() if key == key.lower() else key
            if folded in seen:
                raise bad(f"{key!r} is already defined on line {seen[folded]}")
            seen[folded] = number
            entries.append(Entry(key, respelling, phonemes))
            if len(entries) > MAX_ENTRIES:
                raise bad(f"more than {MAX_ENTRIES} entries")
        return cls(entries)

    @classmethod
    def load(cls, path: str | Path) -> Lexicon:
        """Read and parse the file at ``path``. Raises :class:`ConfigError`."""
        try:
            text = Path(path).read_text("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"cannot read lexicon {path}: {exc}") from None
        return cls.from_text(text, str(path))


@functools.lru_cache(maxsize=256)
def for_line(entries: tuple[tuple[str, str], ...]) -> Lexicon | None:
    """A line's own ``(word, respelling)`` entries (``SynthesisRequest.lexicon``, validated by
    the gateway) as a :class:`Lexicon`; ``None`` for none. Cached: a room repeats its overrides,
    and compiling the pattern is most of the cost."""
    return Lexicon(Entry(key, respelling) for key, respelling in entries) if entries else None


def _matches(text: str, lexicons: Sequence[Lexicon]) -> Iterator[tuple[Lexicon, re.Match[str]]]:
    """The matches of several lexicons as one pattern of all their keys would give them: left to
    right, not overlapping, at one place the longest; where two match the same span, the first
    lexicon's. Each pattern is searched on its own, so a line's override never recompiles the
    deployment's (possibly 10 000-entry) pattern."""
    patterns = [lex._pattern for lex in lexicons]
    ahead: list[re.Match[str] | None] = [p.search(text) if p is not None else None for p in patterns]
    pos = 0
    while True:
        best = -1
        for i, found in enumerate(ahead):
            pattern = patterns[i]
            if found is not None and found.start() < pos and pattern is not None:
                ahead[i] = found = pattern.search(text, pos)  # it overlapped the match taken
            if found is None:
                continue
            chosen = ahead[best] if best >= 0 else None
            if chosen is None or (found.start(), -found.end()) < (chosen.start(), -chosen.end()):
                best = i
        chosen = ahead[best] if best >= 0 else None
        if chosen is None:
            return
        yield lexicons[best], chosen
        pos = chosen.end()


def _alternative(entry: Entry) -> str:
    body = r"\s+".join(re.escape(word) for word in entry.key.split(" "))
    if entry.any_case:
        body = f"(?i:{body})"
    before = f"(?<!{_NOT_WORD})" if re.match(_NOT_WORD, entry.key) else ""
    after = f"(?!{_NOT_WORD})" if re.match(_NOT_WORD, entry.key[-1]) else ""
    return f"{before}{body}{after}"
