"""ChatTTS architecture overrides: a model that is not the published one (the tiny test checkpoint, a
retrained model) says its shapes in ``voxroom_arch.json`` next to ``asset/``.

ChatTTS builds its modules from ``Chat.config`` (dataclasses whose defaults are the published model).
Those defaults are *shared class-level instances*, so we replace sub-objects and never mutate them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

ARCH_FILE = "voxroom_arch.json"


def read_arch(root: str | os.PathLike[str]) -> dict[str, Any] | None:
    path = Path(root) / ARCH_FILE
    if not path.is_file():
        return None
    data: dict[str, Any] = json.loads(path.read_text("utf-8"))
    return data


def apply_arch(config: Any, arch: dict[str, Any]) -> None:
    """Replace the parts of a ``ChatTTS.config.Config`` that ``arch`` names (fresh objects only)."""
    from ChatTTS.config import config as c

    if "gpt" in arch:
        config.gpt = c.GPT(**arch["gpt"])
    if "embed" in arch:
        config.embed = c.Embed(**arch["embed"])
    if "decoder" in arch:
        config.decoder = c.Decoder(**arch["decoder"])
    if "dvae" in arch:
        d = arch["dvae"]
        vq = dict(d["vq"])
        vq["levels"] = tuple(vq["levels"])
        config.dvae = c.DVAE(encoder=c.Decoder(**d["encoder"]), decoder=c.Decoder(**d["decoder"]),
                             vq=c.VQ(**vq))
    if "vocos" in arch:
        v = arch["vocos"]
        config.vocos = c.Vocos(
            feature_extractor=c.FeatureExtractor(init_args=c.FeatureExtractorInitArgs()),
            backbone=c.Backbone(init_args=c.BackboneInitArgs(**v["backbone"])),
            head=c.FourierHead(init_args=c.FourierHeadInitArgs(**v["head"])),
        )
    if "spk_stat" in arch:
        config.spk_stat = arch["spk_stat"]
