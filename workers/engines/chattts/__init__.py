"""ChatTTS engine. Importing this package does not import torch: :class:`ChatTTSEngine` is loaded on
first access, and :func:`find_chattts_weights` / :func:`chattts_installed` are stdlib only, so the
worker's ``auto`` mode can probe for ChatTTS on machines without the extra."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workers.engines.chattts.weights import chattts_installed, find_chattts_weights

if TYPE_CHECKING:
    from workers.engines.chattts.engine import ChatTTSEngine

__all__ = ["ChatTTSEngine", "chattts_installed", "find_chattts_weights"]


def __getattr__(name: str) -> Any:
    if name == "ChatTTSEngine":
        from workers.engines.chattts.engine import ChatTTSEngine

        return ChatTTSEngine
    raise AttributeError(name)
