"""Voices to speaker embeddings, with a per-context cache (a voice switch is a dict lookup).

A chattts voice in the catalog has ``params`` of one of three kinds::

    {"embedding": "<ChatTTS base16384 string>"}     # what Chat.sample_random_speaker() returns
    {"seed": 2222}                                  # torch.manual_seed(2222); chat.sample_random_speaker()
    {"blend": [{"voice": "a", "weight": 0.6}, {"voice": "b", "weight": 0.4}]}

ChatTTS L2-normalises the embedding before use, so only its direction matters: every embedding here is
stored unit-norm, a blend is the normalised weighted sum of unit vectors, and an A->B transition steps
along the normalised linear path (nlerp) between them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F

from voxroom.errors import EngineError, UnknownVoice
from voxroom.voices import Voice

log = logging.getLogger("voxroom.engine.chattts")

VoiceLookup = Callable[[str], Voice]


class SpeakerBank:
    """Resolves voices of one context to unit-norm embeddings on that context's device."""

    def __init__(self, speaker: Any, device: torch.device, lookup: VoiceLookup | None = None) -> None:
        self.speaker = speaker  # ChatTTS.model.speaker.Speaker: has std/mean and the string codec
        self.device = device
        self.lookup = lookup
        self._cache: dict[str, torch.Tensor] = {}

    def embedding(self, voice: Voice) -> torch.Tensor:
        """The unit-norm embedding of ``voice`` (computed once, then cached by voice id).
        Raises :class:`EngineError` for malformed params, :class:`UnknownVoice` for a blend part."""
        cached = self._cache.get(voice.id)
        if cached is None:
            cached = self._compute(voice, depth=0)
            self._cache[voice.id] = cached
        return cached

    def _compute(self, voice: Voice, depth: int) -> torch.Tensor:
        params: Mapping[str, Any] = voice.params
        if "embedding" in params:
            try:
                raw = torch.from_numpy(self.speaker._decode(str(params["embedding"])))
            except Exception as exc:  # lzma/base16384 errors on a damaged string
                raise EngineError(f"voice {voice.id!r}: bad ChatTTS embedding string ({exc})") from None
            return self._unit(raw, voice)
        if "seed" in params:
            # Exactly `torch.manual_seed(seed); chat.sample_random_speaker()` (float16 draw on the CPU),
            # so the seeds users know from the ChatTTS community name the same voices here, but from a
            # private generator: the process-wide RNG of other contexts is left alone.
            gen = torch.Generator(device="cpu").manual_seed(int(params["seed"]))
            std, mean = self.speaker.std.cpu(), self.speaker.mean.cpu()
            raw = torch.randn(self.speaker.dim, generator=gen, dtype=std.dtype).mul_(std).add_(mean)
            return self._unit(raw, voice)
        if "blend" in params:
            return self._blend(voice, params["blend"], depth)
        raise EngineError(f"voice {voice.id!r}: chattts params need 'embedding', 'seed' or 'blend'")

    def _blend(self, voice: Voice, parts: Any, depth: int) -> torch.Tensor:
        if depth > 4:
            raise EngineError(f"voice {voice.id!r}: blends nest too deep (a cycle?)")
        if self.lookup is None:
            raise EngineError(f"voice {voice.id!r} is a blend but the engine has no catalog")
        total: torch.Tensor | None = None
        for part in parts:
            other = self.lookup(str(part["voice"]))
            if other.engine != "chattts":
                raise UnknownVoice(other.id)
            vec = self._cache.get(other.id)
            if vec is None:
                vec = self._compute(other, depth + 1)
            term = vec * float(part["weight"])
            total = term if total is None else total + term
        if total is None:
            raise EngineError(f"voice {voice.id!r}: empty blend")
        return self._unit(total, voice)

    def _unit(self, raw: torch.Tensor, voice: Voice) -> torch.Tensor:
        vec = raw.float().flatten()
        if vec.numel() != self.speaker.dim:
            raise EngineError(f"voice {voice.id!r}: embedding has {vec.numel()} values, "
                              f"the model wants {self.speaker.dim}")
        return F.normalize(vec, dim=0).to(self.device)


def interpolate(a: torch.Tensor, b: torch.Tensor, t: float) -> torch.Tensor:
    """A unit vector ``t`` of the way from ``a`` to ``b`` (nlerp; ``a`` at 0, ``b`` at 1). The ends
    are ``a`` and ``b`` themselves, so a switch's last piece is the new voice to the bit (its audio,
    and cache entry, equal the plain voice's)."""
    if t <= 0.0:
        return a
    if t >= 1.0:
        return b
    return F.normalize(a * (1.0 - t) + b * t, dim=0)


def transition(a: torch.Tensor, b: torch.Tensor, pieces: int, steps: int, start: float = 0.0,
               end: float = 1.0) -> list[torch.Tensor]:
    """Embeddings for ``pieces`` consecutive pieces moving from ``start`` to ``end`` of the way from
    ``a`` to ``b`` in ``steps`` steps: piece ``j`` is at ``start + (end - start) * min(1, (j + 1) / n)``,
    ``n = min(steps, pieces)``, so the utterance always ends at ``end`` even when it has fewer pieces
    than steps. The whole switch in one utterance is ``start=0, end=1`` (it ends on ``b``, the room's
    new voice); a switch spread over L utterances gives utterance k ``start=k/L, end=(k+1)/L``."""
    n = max(1, min(steps, pieces))
    return [interpolate(a, b, start + (end - start) * min(1.0, (j + 1) / n)) for j in range(pieces)]


def switch_steps(steps: int, start: float, end: float) -> int:
    """Pieces wanted for the ``start``..``end`` part of a switch whose whole path is ``steps`` steps
    (at least 1): a switch spread over several utterances keeps about ``steps`` steps in all, so
    each utterance is cut into fewer pieces (each piece is one GPT pass, and costs latency)."""
    # The epsilon absorbs float error at whole numbers: 5 * (4/5 - 3/5) is 1.0000000000000004.
    return max(1, math.ceil(steps * (end - start) - 1e-9))
