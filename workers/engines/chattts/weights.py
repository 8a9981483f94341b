"""Where ChatTTS weights are, decided without importing torch (the worker's ``auto`` mode runs this on
machines that have no torch at all).

``auto`` picks ChatTTS when :func:`find_chattts_weights` returns a directory *and* the chattts extra
imports (:func:`chattts_installed`); otherwise the offline voices. It never downloads: a download is a
deliberate choice (``--engine chattts`` with ``source="huggingface"``).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping
from pathlib import Path

# Every file ChatTTS's own asset check (ChatTTS/utils/dl.py: check_all_assets) reads.
ASSET_FILES: tuple[str, ...] = (
    "asset/Decoder.safetensors",
    "asset/DVAE.safetensors",
    "asset/Embed.safetensors",
    "asset/Vocos.safetensors",
    "asset/gpt/config.json",
    "asset/gpt/model.safetensors",
    "asset/tokenizer/special_tokens_map.json",
    "asset/tokenizer/tokenizer_config.json",
    "asset/tokenizer/tokenizer.json",
)

HF_REPO_DIR = "models--2Noise--ChatTTS"
LOCAL_DIR_ENV = "VOXROOM_CHATTTS_DIR"


def has_assets(root: str | os.PathLike[str]) -> bool:
    """True when ``root`` holds every file of ChatTTS's asset layout (presence only; hashes are
    checked by the loader, which can take seconds on 1 GB of weights)."""
    base = Path(root)
    return all((base / name).is_file() for name in ASSET_FILES)


def hf_snapshot(cache_dir: str | os.PathLike[str] | None = None,
                environ: Mapping[str, str] | None = None) -> Path | None:
    """The newest complete ``2Noise/ChatTTS`` snapshot in a Hugging Face cache, or ``None``.

    ``cache_dir`` is a hub cache (the directory holding ``models--2Noise--ChatTTS``); by default
    ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else ``~/.cache/huggingface/hub``, the order
    huggingface_hub itself uses."""
    env = os.environ if environ is None else environ
    if cache_dir is None:
        if env.get("HF_HUB_CACHE"):
            cache_dir = env["HF_HUB_CACHE"]
        else:
            home = env.get("HF_HOME") or os.path.join(os.path.expanduser("~"), ".cache", "huggingface")
            cache_dir = os.path.join(home, "hub")
    snapshots = Path(cache_dir) / HF_REPO_DIR / "snapshots"
    try:
        candidates = [p for p in snapshots.iterdir() if p.is_dir() and has_assets(p)]
    except OSError:
        return None
    # ChatTTS itself loads the most recently modified snapshot; do the same among complete ones.
    return max(candidates, key=lambda p: p.stat().st_mtime, default=None)


def find_chattts_weights(chattts_dir: str | os.PathLike[str] | None = None,
                         source: str = "huggingface",
                         environ: Mapping[str, str] | None = None) -> Path | None:
    """The directory to load ChatTTS from, or ``None`` when no complete set of weights is on disk.

    Looked up in this order: ``chattts_dir`` (the ``--chattts-dir`` setting), ``$VOXROOM_CHATTTS_DIR``,
    then the Hugging Face cache (unless ``source`` is ``"local"`` or ``"custom"``, which name a
    directory and nothing else). A directory found here loads with
    ``ChatTTSEngine(source="local", custom_path=str(path))``: a HF snapshot has the same layout."""
    env = os.environ if environ is None else environ
    for candidate in (chattts_dir, env.get(LOCAL_DIR_ENV)):
        if candidate and has_assets(candidate):
            return Path(candidate)
    if source == "huggingface":
        return hf_snapshot(environ=env)
    return None


def chattts_installed() -> bool:
    """Whether the chattts extra is importable, checked without importing it (torch takes seconds)."""
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "ChatTTS"))
