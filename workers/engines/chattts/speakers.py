"""Voices to speaker embeddings, with a per-context cache (a voice switch is a dict lookup).

A chattts voice in the catalog has ``params`` of one of three kinds::

    {"embedding": "<ChatTTS base16384 string>"}     # what Chat.sample_random_speaker() returns
    {"seed": 2222}                                  # torch.manual_seed(2222); chat.sample_random_speaker()
    {"blend": [{"voice": "a", "weight": 0.6}, {"voice": "b", "weight": 0.4}]}

ChatTTS L2-normalises the embedding before use, so only its direction matters: every embedding here is
stored unit-norm, a blend is the normalised weighted sum of unit vectors, and an A->B transition steps
along the normalised linear path (nlerp) between them.

The cache is bounded: a client can name any mix (``a:2+b``, voxroom/voices/mix.py), so the ids a
context sees are not bounded by the catalog. It is one LRU over every id, catalog voices and mixes
alike, with no class of entry kept apart: a mix's parts go through the cache too, so the voices in
use stay near the recent end, and an entry evicted anyway is recomputed, bit for bit, from its
params (a seed draw or a decode of about 1 KB, far below a GPT step).
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final

import torch
import torch.nn.functional as F

from voxroom.errors import EngineError, UnknownVoice
from voxroom.voices.catalog import Voice

log = logging.getLogger("voxroom.engine.chattts")

VoiceLookup = Callable[[str], Voice]

SPEAKER_CACHE: Final = 256
"""Embeddings one bank keeps by default: 256 x 768 float32 is 0.8 MB on the context's device, far
more voices than rooms switch between, while any number of distinct mixes stays within it."""


class SpeakerBank:
    """Resolves voices of one context to unit-norm embeddings on that context's device."""

    def __init__(self, speaker: Any, device: torch.device, lookup: VoiceLookup | None = None, *,
                 capacity: int = SPEAKER_CACHE) -> None:
        """``capacity``: embeddings kept, least recently used evicted first (at least 1). Not
        thread-safe: a bank belongs to one context's thread. Raises :class:`EngineError`."""
        if capacity < 1:
            raise EngineError(f"chattts: the speaker cache holds at least 1 embedding, got {capacity}")
        self.speaker = speaker  # ChatTTS.model.speaker.Speaker: has std/mean and the string codec
        self.device = device
        self.lookup = lookup
        self.capacity = capacity
        self._cache: OrderedDict[str, torch.Tensor] = OrderedDict()

    def __len__(self) -> int:
        """Embeddings held now (at most ``capacity``)."""
        return len(self._cache)

    def embedding(self, voice: Voice) -> torch.Tensor:
        """The unit-norm embedding of ``voice`` (cached by voice id, least recently used evicted).
        Raises :class:`EngineError` for malformed params, :class:`UnknownVoice` for a blend part."""
        return self._cached(voice, depth=0)

    def _cached(self, voice: Voice, depth: int) -> torch.Tensor:
        found = self._cache.get(voice.id)
        if found is not None:
            self._cache.move_to_end(voice.id)
            return found
        made = self._compute(voice, depth)
        self._cache[voice.id] = made
        if len(self._cache) > self.capacity:
            self._cache.popitem(last=False)
        return made

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
            term = self._cached(other, depth + 1) * float(part["weight"])
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
