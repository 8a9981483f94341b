"""Load a ChatTTS ``Chat`` through ChatTTS's own loader, and translate its failures.

``Chat.load`` reports a missing or corrupt model by logging and returning ``False`` (or by raising from
deep inside safetensors/transformers); callers of voxroom get one :class:`ModelNotFound` with a message
that says where we looked and what to do, never a traceback.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from voxroom.errors import EngineError, ModelNotFound
from workers.engines.chattts.architecture import apply_arch, read_arch
from workers.engines.chattts.random_checkpoint import SHA256_FILE
from workers.engines.chattts.weights import has_assets

if TYPE_CHECKING:
    from ChatTTS import Chat

log = logging.getLogger("voxroom.engine.chattts")

Source = Literal["huggingface", "local", "custom"]
SOURCES: tuple[str, ...] = ("huggingface", "local", "custom")


def load_chat(*, source: str = "huggingface", custom_path: str | os.PathLike[str] | None = None,
              device: str = "cpu", sha256_map: Mapping[str, str] | None = None) -> Chat:
    """A loaded ``ChatTTS.Chat`` on ``device``.

    * ``huggingface``: the newest snapshot in the HF cache (``custom_path`` is then a cache dir),
      downloaded from the hub when absent (needs network).
    * ``local``: a directory holding ChatTTS's ``asset/`` layout with the published weights (hash-checked).
      Unlike ChatTTS's own ``local`` mode this never downloads: a server that silently pulls 1 GB at
      start-up is worse than a clear error.
    * ``custom``: a directory with another model in the same layout; its hashes come from ``sha256_map``
      or the directory's ``sha256_map.json``, its shapes from ``voxroom_arch.json`` when present.

    Raises :class:`ModelNotFound` when weights are missing or corrupt, :class:`EngineError` for a bad
    ``source``."""
    if source not in SOURCES:
        raise EngineError(f"chattts source must be one of {', '.join(SOURCES)}, not {source!r}")
    if source in ("local", "custom"):
        if custom_path is None:
            raise ModelNotFound(f"chattts source={source!r} needs a directory (--chattts-dir)")
        if not has_assets(custom_path):
            raise ModelNotFound(f"no ChatTTS weights in {custom_path}: expected asset/{{Vocos,DVAE,Decoder,"
                                f"Embed}}.safetensors, asset/gpt/ and asset/tokenizer/")

    import torch
    from ChatTTS import Chat

    # ChatTTS logs its own progress and failures; keep them under our logger tree, one level down.
    chat = Chat(logging.getLogger("voxroom.engine.chattts.upstream"))
    if source == "custom":
        assert custom_path is not None
        own = sha256_map if sha256_map is not None else _read_sha256(Path(custom_path))
        if own is None:
            raise ModelNotFound(f"custom ChatTTS model in {custom_path} has no sha256_map.json "
                                f"(ChatTTS checks every asset against its hash)")
        chat.sha256_map = dict(own)
    if custom_path is not None and source != "huggingface":
        arch = read_arch(custom_path)
        if arch is not None:
            apply_arch(chat.config, arch)

    path = None if custom_path is None else str(custom_path)
    # ChatTTS's own `local` mode downloads into the directory when a hash does not match; its `custom`
    # mode checks the same hashes (here the published ones) and never downloads, which is what we want.
    upstream_source = "custom" if source == "local" else source
    try:
        ok = chat.load(source=upstream_source, custom_path=path, device=torch.device(device), compile=False)
    except Exception as exc:  # safetensors/transformers/torch errors on a damaged file
        raise ModelNotFound(f"ChatTTS model from {source} ({path or 'default cache'}) could not be "
                            f"loaded: {type(exc).__name__}: {exc}") from None
    if not ok:
        where = path or "the Hugging Face cache"
        hint = ("a file is missing or its sha256 does not match (see the log above)"
                if source != "huggingface" else "not in the cache and the hub could not be reached")
        raise ModelNotFound(f"ChatTTS model from {source} ({where}) not loaded: {hint}")
    log.info("ChatTTS loaded from %s (%s) on %s", source, path or "default cache", device)
    return chat


def _read_sha256(root: Path) -> dict[str, str] | None:
    try:
        data = json.loads((root / SHA256_FILE).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return {str(k): str(v) for k, v in data.items()}
