"""Voices by scene: tags in (``{"emotion": "angry", "language": "cantonese"}``), best voices out.

Every voice is a unit vector in one tag space: each ``name=value`` feature (``gender=female``,
``language=yue``, plus ``family=zho`` for the macrolanguage) gets a weight per tag name (matching
the language counts three times as much as matching the style) at its own position: the first
:data:`VOCAB_DIMS` dimensions are one per known feature (:data:`VOCABULARY`, append-only, so
stored vectors keep their meaning), and features nobody listed (``accent=scottish``) are hashed
into the remaining dimensions, where two of them may share a position. A scene is embedded the
same way and scored by cosine similarity against every voice at once (one matrix-vector
product), then the top ``k`` are taken with ``argpartition``. The vector is deterministic (no
model, no training), so the same catalog
gives the same ranking on every gateway; a catalog entry may instead set its own ``vector`` of
:data:`DIM` floats in this space (a hand-tuned blend, e.g. 70 % calm and 30 % sad).

Exact search is the right tool at catalog sizes: docs/benchmarks.md measures where an
approximate index would start to win (far beyond any real voice catalog).
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import numpy as np
import numpy.typing as npt

from voxroom.errors import ConfigError, UnknownVoice
from voxroom.voices.catalog import Catalog, Voice
from voxroom.voices.languages import UnknownLanguage, normalize_language

DIM: Final = 256
VOCAB_DIMS: Final = 192
_LANGS: Final = ("eng", "cmn", "yue", "wuu", "nan", "hak", "zho", "jpn", "kor", "fra", "deu", "spa", "ita", "por",
                 "rus", "arb", "ara", "hin", "nld", "vie", "tha", "tur", "pol", "ind", "msa", "zsm", "swe", "nor",
                 "nob", "dan", "fin", "ces", "ell", "heb", "hun", "ron", "ukr", "urd", "ben", "cat", "pes", "fas",
                 "tam", "swh", "swa")
VOCABULARY: Final = (
    *(f"language={c}" for c in _LANGS), *(f"family={c}" for c in _LANGS),
    "dialect=sichuan", "dialect=taiwan", "dialect=hongkong", "dialect=beijing", "dialect=british",
    "dialect=american", "dialect=australian", "dialect=indian",
    "gender=male", "gender=female", "gender=neutral",
    "age=child", "age=young", "age=adult", "age=elderly",
    "emotion=neutral", "emotion=calm", "emotion=happy", "emotion=sad", "emotion=angry", "emotion=fearful",
    "emotion=excited", "emotion=surprised", "emotion=disgusted", "emotion=tender", "emotion=serious",
    "emotion=playful",
    "style=narrator", "style=storyteller", "style=conversational", "style=announcer", "style=robotic",
    "style=whisper", "style=character", "style=news", "style=commercial", "style=villain", "style=hero",
)
"""Never reorder or remove: positions are part of stored vectors. Append up to VOCAB_DIMS."""
_POSITION: Final = {feature: i for i, feature in enumerate(VOCABULARY)}
WEIGHTS: Final = {"language": 3.0, "dialect": 2.0, "gender": 1.5, "family": 1.0, "age": 1.0, "emotion": 1.0,
                  "style": 1.0}
OTHER_WEIGHT: Final = 0.5
"""Tags the table does not name (``accent``, ``pace``...) still count, a little."""

# What people write for the same tag value: folded before hashing so ``woman`` finds ``female``.
SYNONYMS: Final = {
    "gender": {"m": "male", "man": "male", "boy": "male", "f": "female", "woman": "female", "girl": "female"},
    "age": {"kid": "child", "children": "child", "teen": "young", "teenager": "young", "youth": "young",
            "old": "elderly", "senior": "elderly", "middle-aged": "adult", "grown": "adult"},
    "emotion": {"anger": "angry", "furious": "angry", "mad": "angry", "joyful": "happy", "cheerful": "happy",
                "sadness": "sad", "scared": "fearful", "afraid": "fearful", "fear": "fearful",
                "relaxed": "calm", "serene": "calm", "excitement": "excited"},
    "style": {"narration": "narrator", "storytelling": "storyteller", "robot": "robotic",
              "whispering": "whisper", "announcement": "announcer"},
}

Vector = npt.NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class Match:
    voice: Voice
    score: float
    """Cosine similarity in [-1, 1]; 1 is every weighted tag matching."""

    def public(self) -> dict[str, object]:
        return {**self.voice.public(), "score": round(self.score, 4)}


def features(tags: Mapping[str, str], language: str | None = None) -> dict[str, float]:
    """Weighted ``name=value`` features of a voice (its language and tags) or of a scene.

    A ``language`` (argument or tag) is normalised to ISO 639-3 and adds its dialect and its
    macrolanguage family; an unknown one is kept as written (it matches only itself).
    """
    out: dict[str, float] = {}
    merged = {k.strip().lower(): v.strip().lower() for k, v in tags.items() if v and v.strip()}
    lang = merged.pop("language", None) or (language.strip().lower() if language else None)
    if lang:
        try:
            parsed = normalize_language(lang)
            out[f"language={parsed.code}"] = WEIGHTS["language"]
            out[f"family={parsed.family}"] = WEIGHTS["family"]
            if parsed.dialect and "dialect" not in merged:
                merged["dialect"] = parsed.dialect
        except UnknownLanguage:
            out[f"language={lang}"] = WEIGHTS["language"]
    for name, value in merged.items():
        value = SYNONYMS.get(name, {}).get(value, value)
        if name == "dialect":
            try:  # ``dialect: sichuanese`` and ``dialect: sichuan`` are one dialect
                value = normalize_language(value).dialect or value
            except UnknownLanguage:
                pass
        out[f"{name}={value}"] = WEIGHTS.get(name, OTHER_WEIGHT)
    return out


def embed(weighted: Mapping[str, float], dim: int = DIM) -> Vector:
    """Known features at their own position; unknown ones hashed (BLAKE2) into the dimensions after
    :data:`VOCAB_DIMS`, with a hashed sign so that collisions do not add up. Unit length (or 0)."""
    vec = np.zeros(dim, dtype=np.float32)
    spare = dim - VOCAB_DIMS
    for feature, weight in weighted.items():
        position = _POSITION.get(feature)
        if position is not None:
            vec[position] += weight
            continue
        # surrogatepass: the edge refuses unencodable strings, and the index must not raise if one slips by.
        h = int.from_bytes(hashlib.blake2b(feature.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "big")
        vec[VOCAB_DIMS + h % spare] += weight if (h >> 63) & 1 else -weight
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm > 0 else vec


def voice_vector(voice: Voice, dim: int = DIM) -> Vector:
    if voice.vector is not None:
        if len(voice.vector) != dim:
            raise ConfigError(f"voice {voice.id!r}: vector has {len(voice.vector)} values; the search space has {dim}")
        vec = np.asarray(voice.vector, dtype=np.float32)
        norm = float(np.linalg.norm(vec))
        return vec / norm if norm > 0 else vec
    return embed(features(voice.tags, voice.language), dim)


def top_k(matrix: Vector, query: Vector, k: int, mask: npt.NDArray[np.bool_] | None = None,
          ) -> tuple[npt.NDArray[np.intp], Vector]:
    """Exact top ``k`` rows of ``matrix`` (unit rows) by dot product with ``query``, best first;
    rows where ``mask`` is False are left out. Ties keep catalog order (a stable sort)."""
    scores = matrix @ query
    if mask is not None:
        scores = np.where(mask, scores, -np.inf).astype(np.float32)
    n = int(np.count_nonzero(np.isfinite(scores)))
    k = min(k, n)
    if k <= 0:
        return np.zeros(0, dtype=np.intp), np.zeros(0, dtype=np.float32)
    if k < scores.size:
        part = np.argpartition(-scores, k - 1)[:k]
        kth = scores[part].min()
        # Everything tied with the k-th best is a candidate, so that ties resolve by catalog order.
        part = np.flatnonzero(scores >= kth)
    else:
        part = np.arange(scores.size)
    order = part[np.argsort(-scores[part], kind="stable")][:k]
    return order, scores[order]


class VoiceIndex:
    """The catalog's vectors as one ``(voices, DIM)`` float32 matrix. Immutable: rebuild on change."""

    def __init__(self, voices: Sequence[Voice], *, dim: int = DIM) -> None:
        self.voices = list(voices)
        self.dim = dim
        self.matrix: Vector = (np.stack([voice_vector(v, dim) for v in self.voices]) if self.voices
                               else np.zeros((0, dim), dtype=np.float32))

    def search(self, scene: Mapping[str, str], k: int = 5,
               allowed: Callable[[Voice], bool] | None = None) -> list[Match]:
        """The ``k`` voices nearest to the scene, best first, among those ``allowed`` says yes to.

        A scene that names a language finds only voices of that language's family (its
        macrolanguage: Cantonese may fall back to Mandarin, never to English), so a language no
        voice speaks finds nothing rather than the nearest voice of another language. Raises
        :class:`UnknownLanguage` for a language that cannot be mapped (the protocol edge refuses
        those first, with ``unknown_language``)."""
        family = _scene_family(scene)
        mask: npt.NDArray[np.bool_] | None = None
        if allowed is not None or family is not None:
            mask = np.array([(allowed is None or allowed(v)) and (family is None or _family(v) == family)
                             for v in self.voices], dtype=bool)
        rows, scores = top_k(self.matrix, embed(features(scene), self.dim), k, mask)
        return [Match(self.voices[int(i)], float(s)) for i, s in zip(rows, scores, strict=True)]


def _scene_family(scene: Mapping[str, str]) -> str | None:
    """The macrolanguage a scene's ``language`` tag names, or ``None`` when it names none."""
    language = next((v for k, v in scene.items() if k.strip().lower() == "language" and v.strip()), None)
    return normalize_language(language).family if language is not None else None


def _family(voice: Voice) -> str:
    try:
        return normalize_language(voice.language).family
    except UnknownLanguage:  # a catalog code outside the tables: it is only its own family
        return voice.language.strip().lower()


_INDEXES: weakref.WeakKeyDictionary[Catalog, VoiceIndex] = weakref.WeakKeyDictionary()


def index_for(catalog: Catalog) -> VoiceIndex:
    """The catalog's index, built once per catalog object (a catalog never changes once loaded)."""
    index = _INDEXES.get(catalog)
    if index is None:
        index = _INDEXES[catalog] = VoiceIndex(list(catalog))
    return index


def resolve_scene(catalog: Catalog, scene: Mapping[str, str],
                  allowed: Callable[[Voice], bool] | None = None) -> Voice:
    """The best voice for a scene. Raises :class:`UnknownVoice` when no allowed voice exists (none
    of the scene's language family, when it names a language) and :class:`UnknownLanguage` for a
    language that cannot be mapped."""
    found = index_for(catalog).search(scene, 1, allowed)
    if not found:
        raise UnknownVoice(f"scene {dict(scene)}")
    return found[0].voice
