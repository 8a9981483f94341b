"""The voice catalog: which voices exist, which engine speaks each, and in which language.

The catalog is a JSON file (``voxroom/voices/voices.json`` by default, ``VOXROOM_VOICES_PATH`` to replace
it). Gateways use it to refuse unknown voices before anything reaches Redis; workers use it to find
the engine and its parameters.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from voxroom.errors import ConfigError, UnknownVoice
from voxroom.voices import mix
from voxroom.voices.voice import Voice

__all__ = ["Catalog", "Voice"]


class Catalog:
    def __init__(self, voices: list[Voice], default: str) -> None:
        self._voices = {v.id: v for v in voices}
        if len(self._voices) != len(voices):
            raise ConfigError("voice catalog has duplicate ids")
        if default not in self._voices:
            raise ConfigError(f"default voice {default!r} is not in the catalog")
        self.default = default

    def __iter__(self) -> Iterator[Voice]:
        return iter(self._voices.values())

    def __len__(self) -> int:
        return len(self._voices)

    def __contains__(self, voice_id: object) -> bool:
        if voice_id in self._voices:
            return True
        if not isinstance(voice_id, str) or "+" not in voice_id:
            return False
        try:
            self.get(voice_id)
        except UnknownVoice:
            return False
        return True

    def get(self, voice_id: str | None) -> Voice:
        """The voice, or the default for ``None``; a mix of catalog voices for an id such as
        ``a:2+b`` (voxroom/voices/mix.py). Raises :class:`UnknownVoice` (``BadMix`` for a mix)."""
        if voice_id is None:
            return self._voices[self.default]
        try:
            return self._voices[voice_id]
        except KeyError:
            if "+" in voice_id:
                return mix.resolve(voice_id, self._own)
            raise UnknownVoice(voice_id) from None

    def _own(self, voice_id: str) -> Voice:
        """A voice of the catalog itself (a mix's part is never a mix)."""
        try:
            return self._voices[voice_id]
        except KeyError:
            raise UnknownVoice(voice_id) from None

    def engines(self) -> set[str]:
        return {v.engine for v in self._voices.values()}

    def only_engines(self, engines: set[str], default: str | None = None) -> Catalog:
        """The sub-catalog of voices that the given engines can speak."""
        kept = [v for v in self._voices.values() if v.engine in engines]
        if not kept:
            raise ConfigError(f"no voice in the catalog for engines {sorted(engines)}")
        wanted = default or self.default
        return Catalog(kept, wanted if any(v.id == wanted for v in kept) else kept[0].id)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Catalog:
        try:
            voices = [Voice(id=v["id"], engine=v["engine"], language=v["language"], name=v.get("name", ""),
                            tags=dict(v.get("tags", {})), params=dict(v.get("params", {})),
                            vector=tuple(float(x) for x in v["vector"]) if v.get("vector") else None)
                      for v in data["voices"]]
            return cls(voices, data.get("default", voices[0].id if voices else ""))
        except (KeyError, TypeError, IndexError) as exc:
            raise ConfigError(f"malformed voice catalog: {exc!r}") from None

    @classmethod
    def for_settings(cls, voices_path: str | None, default_voice: str | None) -> Catalog:
        """The catalog a process serves: ``voices_path`` (or the bundled one), its default replaced
        by ``default_voice`` when given. Raises :class:`ConfigError` for a voice it lacks."""
        catalog = cls.load(voices_path)
        if default_voice is None or default_voice == catalog.default:
            return catalog
        return cls(list(catalog), default_voice)

    @classmethod
    def load(cls, path: str | Path | None = None) -> Catalog:
        if path is None:
            text = resources.files("voxroom.voices").joinpath("voices.json").read_text("utf-8")
        else:
            try:
                text = Path(path).read_text("utf-8")
            except OSError as exc:
                raise ConfigError(f"cannot read voice catalog {path}: {exc}") from None
        try:
            return cls.from_dict(json.loads(text))
        except ValueError as exc:
            raise ConfigError(f"voice catalog is not JSON: {exc}") from None
