"""One voice of the catalog: its id, the engine that speaks it, its language and parameters."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True, slots=True)
class Voice:
    id: str
    engine: str
    language: str
    name: str = ""
    tags: Mapping[str, str] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    vector: tuple[float, ...] | None = None
    """Optional hand-set position in the scene-search space (app/ingress/voice_search.py); ``None``
    derives it from the language and tags."""

    def public(self) -> dict[str, Any]:
        """What clients see (``GET /v1/voices``): no engine parameters such as embeddings."""
        return {"id": self.id, "engine": self.engine, "language": self.language, "name": self.name,
                "tags": dict(self.tags)}
