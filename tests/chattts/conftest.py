"""A tiny randomly initialised ChatTTS checkpoint in ChatTTS's own asset layout, loaded through the same
loader users use (``source="custom"``). Everything below runs the real ChatTTS modules on the CPU; the
only thing not exercised is CUDA (no GPU here): fp16 and ``empty_cache`` paths are untested."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# No importorskip: the test command installs the chattts extra, and a suite that silently skipped
# ChatTTS when that install broke would pass while testing nothing of it.
import ChatTTS  # noqa: F401
import numpy as np
import pytest

from voxroom.voices.catalog import Voice
from workers.engines.base import SynthesisRequest
from workers.engines.chattts import (
    ChatTTSEngine,
    random_checkpoint,
)

VOICES = {
    "a": Voice(id="a", engine="chattts", language="eng", params={"seed": 11}),
    "b": Voice(id="b", engine="chattts", language="eng", params={"seed": 22}),
    "c": Voice(id="c", engine="chattts", language="eng", params={"seed": 33}),
    "ab": Voice(id="ab", engine="chattts", language="eng",
                params={"blend": [{"voice": "a", "weight": 0.6}, {"voice": "b", "weight": 0.4}]}),
}


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chattts-tiny")
    random_checkpoint.build(root, "tiny", seed=0)
    return root


def make_engine(tiny_dir: Path, **options: Any) -> ChatTTSEngine:
    defaults: dict[str, Any] = {"source": "custom", "custom_path": str(tiny_dir), "voice_lookup": VOICES.__getitem__,
                                "min_new_tokens": 60, "max_new_tokens": 60}
    defaults.update(options)
    engine = ChatTTSEngine(**defaults)
    engine.load("cpu")
    return engine


@pytest.fixture(scope="session")
def engine(tiny_dir: Path) -> Iterator[ChatTTSEngine]:
    e = make_engine(tiny_dir)
    yield e
    e.close()


@pytest.fixture(scope="session")
def greedy(tiny_dir: Path) -> Iterator[ChatTTSEngine]:
    """Deterministic sampling (argmax), so a row can be compared with itself in another batch."""
    e = make_engine(tiny_dir, temperature=0.0, fade_ms=0.0)
    yield e
    e.close()


def request(text: str, voice: str = "a", previous: str | None = None) -> SynthesisRequest:
    return SynthesisRequest(text=text, voice=VOICES[voice], previous_voice=VOICES[previous] if previous else None)


def collect(it: Iterator[tuple[int, np.ndarray]], rows: int) -> tuple[list[np.ndarray], list[list[int]]]:
    """Join each row's chunks; also return each row's chunk lengths (the join positions)."""
    chunks: list[list[np.ndarray]] = [[] for _ in range(rows)]
    for row, chunk in it:
        assert chunk.dtype == np.float32 and chunk.ndim == 1
        chunks[row].append(chunk)
    audio = [np.concatenate(c) if c else np.zeros(0, np.float32) for c in chunks]
    return audio, [[len(x) for x in c] for c in chunks]


def never() -> threading.Event:
    return threading.Event()


def joins(lengths: list[int]) -> list[int]:
    """Index of the last sample before each join (what ``tests.support.audio.max_jump(at=...)`` takes)."""
    return [int(p) - 1 for p in np.cumsum(lengths)[:-1]]
