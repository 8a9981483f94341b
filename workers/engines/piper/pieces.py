"""Piper's pieces: what one ONNX run makes, with the first sentence cut at a phrase boundary.

Piper runs its model once per sentence, so a line's first audio waits for its whole first
sentence: 100-250 ms for 12-17 words on one core, about 45 ms per second of audio. The model
reads punctuation as phonemes of their own, so a sentence cut right after a comma, semicolon or
colon (espeak-ng writes a dash as a semicolon) gives a first piece that ends the way the phrase
ends inside the sentence, and a second that starts a new phrase: the first audio comes after the
first phrase's synthesis, not the sentence's. Only the first sentence is cut: by the time it has
played, every later sentence is long ready.

The seam. Each run pads its audio: ~50 ms of near silence before the first phoneme, and after
the comma the pause and the model's closing decay (180-300 ms below -40 dBFS). Across the cut
that makes 230-350 ms of silence where the model, reading the whole sentence, pauses 290-400 ms
at the same comma (measured on en_US-joe-medium): the pieces are played back to back as they
are, untrimmed (trimming would shorten the pause further), and meet in silence, so there is no
click. Piper scales each run to full peak; the second piece of a cut sentence gets the first's
gain instead (lowered only if it would clip), so the loudness does not jump at the comma.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

import numpy as np

from workers.engines.base import Pcm

if TYPE_CHECKING:
    from piper import PiperVoice
    from piper.config import SynthesisConfig

PHRASE_ENDS: Final = frozenset(",;:")
"""Phonemes after which a phrase ends inside a sentence (espeak-ng turns a dash into ``;``)."""
FIRST_PIECE_WORDS: Final = 3
"""Fewest phoneme words before the cut: a shorter first phrase ("Yes,") saves little and its
piece would be mostly padding."""
REST_WORDS: Final = 2
"""Fewest phoneme words after the cut: cutting off a last word or two saves nothing."""
_NOT_SOUNDS: Final = frozenset("ˈˌːˑ")


@dataclass(frozen=True, slots=True)
class Piece:
    """One run's audio and what the model was given for it."""

    phonemes: list[str]
    audio: Pcm
    """Float32 in [-1, 1], at the voice's rate."""
    samples: list[int] | None
    """Samples of each phoneme, piper's BOS and EOS included (``None``: the model gives no
    durations, or they were not asked for)."""


def _words(phonemes: Sequence[str]) -> int:
    count, inside = 0, False
    for p in phonemes:
        if p == " " or p in PHRASE_ENDS:
            inside = False
        elif p not in _NOT_SOUNDS and not inside:
            count, inside = count + 1, True
    return count


def plan(sentences: list[list[str]], min_words: int = FIRST_PIECE_WORDS) -> tuple[list[list[str]], bool]:
    """Piper's sentences (``PiperVoice.phonemize``) as the pieces to run, and whether the first
    sentence was cut: at its first phrase end with at least ``min_words`` words before it and
    :data:`REST_WORDS` after. ``min_words`` 0 never cuts. The pieces' phonemes, joined, are the
    sentences' (the space after the cut left out)."""
    if min_words <= 0 or not sentences:
        return sentences, False
    first = sentences[0]
    for i, p in enumerate(first):
        if p in PHRASE_ENDS and _words(first[:i]) >= min_words:
            rest = first[i + 1:]
            while rest and rest[0] == " ":
                rest = rest[1:]
            if _words(rest) >= REST_WORDS:
                return [first[:i + 1], rest, *sentences[1:]], True
            return sentences, False
    return sentences, False


def _phoneme_samples(voice: PiperVoice, phonemes: Sequence[str], ids: Sequence[int],
                     id_samples: Sequence[int]) -> list[int] | None:
    """Samples per phoneme (BOS and EOS included) from samples per phoneme id, as piper's own
    ``synthesize`` sums them: a phoneme's ids and the pad after it."""
    id_map = voice.config.phoneme_id_map
    pad = list(id_map.get("_", []))
    out: list[int] = []
    k = 0
    sequence = ["^", *phonemes, "$"]
    for n, phoneme in enumerate(sequence):
        expected = list(id_map.get(phoneme, [])) + (pad if n + 1 < len(sequence) else [])
        if list(ids[k:k + len(expected)]) != expected:
            return None
        out.append(int(sum(id_samples[k:k + len(expected)])))
        k += len(expected)
    return out


def run(voice: PiperVoice, phonemes: list[str], config: SynthesisConfig, *,
        alignments: bool) -> tuple[Pcm, list[int] | None]:
    """One model run, unscaled: raw audio and samples per phoneme (``None`` without
    ``alignments`` or when the model gives no durations)."""
    ids = voice.phonemes_to_ids(phonemes)
    result = voice.phoneme_ids_to_audio(ids, config, include_alignments=alignments)
    if isinstance(result, tuple):
        audio, id_samples = result
        samples = (_phoneme_samples(voice, phonemes, ids, [int(s) for s in id_samples])
                   if id_samples is not None and len(id_samples) == len(ids) else None)
    else:
        audio, samples = result, None
    return np.asarray(audio, dtype=np.float32).reshape(-1), samples


def scaled(raw: Pcm, config: SynthesisConfig, gain: float | None) -> tuple[Pcm, float]:
    """Piper's own scaling (peak to full scale when ``normalize_audio``, then ``volume``), or
    ``gain`` (the previous piece's, for the rest of a cut sentence) when that does not clip.
    Returns the audio and the gain used."""
    peak = float(np.max(np.abs(raw))) if raw.size else 0.0
    if not config.normalize_audio:
        own = 1.0
    elif peak < 1e-8:
        own = 0.0
    else:
        own = 1.0 / peak
    use = own if gain is None else min(gain, own)
    audio = np.clip(raw * (use * config.volume), -1.0, 1.0).astype(np.float32)
    return audio, use

