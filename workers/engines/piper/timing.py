"""Piper's word timings: the model's own phoneme durations, mapped back to the words of the text.

A Piper (VITS) model decides how many audio frames each phoneme gets (its ``w_ceil`` tensor)
before it makes the audio, so those durations *are* the phonemes' places in the audio, to one
frame (256 samples, 11.6 ms at 22,050 Hz). The shipped models do not output that tensor;
:func:`with_durations` adds it as a graph output, in memory, by editing the ONNX protobuf at the
wire level (three fields: no ``onnx`` package needed). piper-tts then returns per-phoneme sample
counts (``AudioChunk.phoneme_alignments``).

Piper's phonemizer (espeak-ng) does not say which word each phoneme came from, and its words
are not the text's: ``3.5`` becomes three words, ``hi... really`` one, ``Dr.`` a sentence of
its own. :func:`align` pairs the text's words (workers/engines/marks.py) with the phoneme words
(runs between spaces and punctuation) by a banded dynamic programme over their lengths, one to
one where it can, merging up to three on either side where the counts differ.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from workers.engines.marks import Word

_MODEL_GRAPH: Final = 7  # ModelProto.graph
_GRAPH_NODE: Final = 1  # GraphProto.node
_GRAPH_OUTPUT: Final = 12  # GraphProto.output
_NODE_OUTPUT: Final = 2  # NodeProto.output
_NODE_OP_TYPE: Final = 4  # NodeProto.op_type
_VALUE_INFO_NAME: Final = 1  # ValueInfoProto.name
_CEIL_OP: Final = bytes([_NODE_OP_TYPE << 3 | 2, 4]) + b"Ceil"  # op_type = "Ceil", as encoded

_MARKS: Final = frozenset("ˈˌːˑ")
"""Stress and length marks: piper gives them ids of their own, but they are not sounds."""
_BREAKS: Final = frozenset(" ,.;:!?¡¿—–…\"«»“”()")
_SPECIAL: Final = frozenset("^$_")  # BOS, EOS, PAD
_MOVES: Final = ((1, 1), (1, 2), (2, 1), (1, 3), (3, 1), (1, 4))
_BAND: Final = 12
_MERGE: Final = 0.5
_PAUSE_MISMATCH: Final = 1.5
_PUNCTUATION: Final = re.compile(r"[.,;:!?…—–。，、；：！？]")


def _varint(buf: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = buf[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def _encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _fields(buf: bytes, start: int, end: int) -> list[tuple[int, int, int, int]]:
    """``(field, value start, value end, tag start)`` of the length-delimited fields in ``buf[start:end]``."""
    out: list[tuple[int, int, int, int]] = []
    i = start
    while i < end:
        at = i
        tag, i = _varint(buf, i)
        wire = tag & 7
        if wire == 0:
            _, i = _varint(buf, i)
        elif wire == 1:
            i += 8
        elif wire == 5:
            i += 4
        elif wire == 2:
            size, i = _varint(buf, i)
            out.append((tag >> 3, i, i + size, at))
            i += size
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")
    return out


def _field(field: int, payload: bytes) -> bytes:
    return _encode_varint(field << 3 | 2) + _encode_varint(len(payload)) + payload


def with_durations(model: bytes) -> bytes | None:
    """The ONNX model with its phoneme durations (the output of its one ``Ceil`` node) as a
    second graph output; ``None`` when the model has no single ``Ceil`` or already outputs it."""
    graph = next(((s, e, at) for f, s, e, at in _fields(model, 0, len(model)) if f == _MODEL_GRAPH), None)
    if graph is None:
        return None
    start, end, tag_at = graph
    ceil: list[bytes] = []
    outputs: list[bytes] = []
    for field, s, e, _ in _fields(model, start, end):
        if field == _GRAPH_NODE:
            if model.find(_CEIL_OP, s, e) < 0:  # most nodes: skip without parsing them
                continue
            parts = _fields(model, s, e)
            if any(f == _NODE_OP_TYPE and model[a:b] == b"Ceil" for f, a, b, _ in parts):
                ceil.extend(model[a:b] for f, a, b, _ in parts if f == _NODE_OUTPUT)
        elif field == _GRAPH_OUTPUT:
            outputs.extend(model[a:b] for f, a, b, _ in _fields(model, s, e) if f == _VALUE_INFO_NAME)
    if len(ceil) != 1 or ceil[0] in outputs:
        return None
    body = model[start:end] + _field(_GRAPH_OUTPUT, _field(_VALUE_INFO_NAME, ceil[0]))
    return model[:tag_at] + _field(_MODEL_GRAPH, body) + model[end:]


@dataclass(frozen=True, slots=True)
class PhonemeWord:
    """A run of phonemes between spaces or punctuation, and where it sounds in its sentence."""

    weight: float
    pause: bool
    """Punctuation or the sentence's end follows it: what the written word before a comma
    or a full stop must be paired with."""
    start: int
    """Samples from the start of its sentence's audio."""
    end: int


def phoneme_words(phonemes: Sequence[str], samples: Sequence[int] | None) -> list[PhonemeWord]:
    """The phoneme words of one sentence. ``samples``: each phoneme's sample count (BOS and EOS
    included, as piper's alignments give them), or ``None`` (weights only, times 0)."""
    out: list[PhonemeWord] = []
    weight = 0.0
    start = end = t = 0
    sequence = ["^", *phonemes, "$"]
    counts = list(samples) if samples is not None and len(samples) == len(sequence) else [0] * len(sequence)
    for phoneme, count in zip(sequence, counts, strict=True):
        if phoneme in _BREAKS or phoneme in _SPECIAL:
            if weight:
                out.append(PhonemeWord(weight, False, start, end))
            if phoneme != " " and out:
                out[-1] = replace(out[-1], pause=True)
            weight = 0.0
        elif phoneme not in _MARKS:
            if not weight:
                start = t
            weight += 1
            end = t + count
        t += count
    if out:
        out[-1] = replace(out[-1], pause=True)
    return out


def word_weight(text: str) -> float:
    """About how many phonemes a written word becomes: one per letter, four per digit and per
    decimal point (``3.5``: "three point five")."""
    digits = sum(c.isdigit() for c in text)
    points = len(re.findall(r"(?<=\d)[.,](?=\d)", text))
    return float(sum(c.isalpha() for c in text) + 4 * (digits + points) or 1)


def _pause_after(text: str, word: Word, following: Word | None) -> bool:
    """Whether the written word is followed by punctuation that the phonemizer reads as a
    break: not the dot of an initial (``U.S.``) or of a decimal."""
    if following is None:
        return True
    gap = text[word.offset + word.length:following.offset]
    if len(word.text) == 1 and word.text.isalpha() and gap.strip() == ".":
        return False
    return bool(_PUNCTUATION.search(gap))


def align(text: str, words: Sequence[Word], groups: Sequence[PhonemeWord]) -> list[tuple[int, int]] | None:
    """For each word of ``text``, the ``[first, end)`` phoneme words it became, monotone and
    covering both sides; ``None`` when no alignment with the allowed merges exists.

    The cost of pairing a run of written words with a run of phoneme words: how far their
    lengths differ (log ratio, the written side scaled to the phonemes' total), a price per
    merge, and a price when punctuation follows one run but not the other. The last term
    anchors the pairing at every comma and full stop."""
    n, m = len(words), len(groups)
    if n == 0 or m == 0:
        return None
    pauses = [_pause_after(text, w, nxt) for w, nxt in zip(words, [*words[1:], None], strict=True)]
    wsum = [0.0]
    for word in words:
        wsum.append(wsum[-1] + word_weight(word.text))
    gsum = [0.0]
    for g in groups:
        gsum.append(gsum[-1] + g.weight)
    scale = gsum[-1] / wsum[-1]
    inf = math.inf
    cost = [[inf] * (m + 1) for _ in range(n + 1)]
    back: list[list[tuple[int, int] | None]] = [[None] * (m + 1) for _ in range(n + 1)]
    cost[0][0] = 0.0
    for i in range(n + 1):
        centre = i * m / n
        for j in range(max(0, math.floor(centre) - _BAND), min(m, math.ceil(centre) + _BAND) + 1):
            here = cost[i][j]
            if here == inf:
                continue
            for a, b in _MOVES:
                if i + a > n or j + b > m:
                    continue
                written = (wsum[i + a] - wsum[i]) * scale
                spoken = gsum[j + b] - gsum[j]
                step = (here + abs(math.log((written + 1) / (spoken + 1))) + _MERGE * (a + b - 2)
                        + (_PAUSE_MISMATCH if pauses[i + a - 1] != groups[j + b - 1].pause else 0.0))
                if step < cost[i + a][j + b]:
                    cost[i + a][j + b] = step
                    back[i + a][j + b] = (a, b)
    if cost[n][m] == inf:
        return None
    spans: list[tuple[int, int]] = [(0, 0)] * n
    i, j = n, m
    while i or j:
        move = back[i][j]
        if move is None:
            return None
        a, b = move
        for k in range(i - a, i):
            spans[k] = (j - b, j)
        i, j = i - a, j - b
    return spans
