"""The worker's ChatTTS defaults on the CPU are the ones docs/chattts.md recommends: a bf16 GPT,
fp32 only when asked for, int8 taking precedence (the two cannot be combined)."""

from __future__ import annotations

from pathlib import Path

import torch

from voxroom.runtime.settings import Settings
from workers.engines.chattts import ChatTTSEngine
from workers.launch import engine_options

from .conftest import VOICES


def _loaded(tiny_dir: Path, env: dict[str, str]) -> ChatTTSEngine:
    settings = Settings.from_env({"VOXROOM_CHATTTS_SOURCE": "custom", "VOXROOM_CHATTTS_DIR": str(tiny_dir), **env})
    options = engine_options("chattts", settings)
    options["voice_lookup"] = VOICES.__getitem__
    engine = ChatTTSEngine(**options)
    engine.load("cpu")
    return engine


def _gpt_dtypes(engine: ChatTTSEngine) -> set[torch.dtype]:
    assert engine.chat is not None
    return {p.dtype for p in engine.chat.gpt.gpt.parameters()}


def test_a_worker_runs_the_gpt_in_bf16_on_the_cpu_by_default(tiny_dir: Path) -> None:
    engine = _loaded(tiny_dir, {})
    try:
        assert _gpt_dtypes(engine) == {torch.bfloat16}
    finally:
        engine.close()


def test_fp32_when_bf16_is_switched_off(tiny_dir: Path) -> None:
    engine = _loaded(tiny_dir, {"VOXROOM_CHATTTS_BF16": "0"})
    try:
        assert _gpt_dtypes(engine) == {torch.float32}
    finally:
        engine.close()


def test_int8_takes_precedence_over_the_bf16_default(tiny_dir: Path) -> None:
    settings = Settings.from_env({"VOXROOM_CHATTTS_INT8": "1"})
    assert engine_options("chattts", settings)["int8"] is True
    assert engine_options("chattts", settings)["bf16"] is False
