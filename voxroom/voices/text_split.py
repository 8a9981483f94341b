"""Sentence-aware text splitting, done by the server instead of ChatTTS's reference pass.

ChatTTS's own ``split_text=True`` first synthesizes the first sentence without streaming to sample a
speaker prompt, which costs a whole extra utterance before any audio. We split here instead: each piece
is synthesized (and streamed) on its own with the same speaker embedding, so the first audio only waits
for the first piece. Pure Python, no torch.
"""

from __future__ import annotations

import re

MAX_PIECE_CHARS = 120

# A sentence ends after one of these (Chinese full-width and ASCII), plus closing quotes/brackets.
_SENTENCE_END = re.compile(r"(?<=[。！？!?…；;])[”’\"')）」』]*\s*|(?<=\.)[\"')]*\s+|\n+")
# Where a long sentence may be cut when it has no sentence end: commas and similar pauses.
_CLAUSE_END = re.compile(r"(?<=[，、,：:])\s*")


def split_text(text: str, max_chars: int = MAX_PIECE_CHARS) -> list[str]:
    """Split ``text`` into pieces of at most ``max_chars`` characters, preferring sentence ends, then
    clause ends (commas), then spaces, and only as a last resort a hard cut (long runs of Chinese
    without punctuation). Whitespace-only pieces are dropped; the pieces joined with spaces keep every
    non-space character of ``text`` in order."""
    if max_chars < 1:
        raise ValueError("max_chars must be positive")
    pieces: list[str] = []
    for sentence in _split_keep(text, _SENTENCE_END):
        if len(sentence) <= max_chars:
            pieces.append(sentence)
            continue
        pieces.extend(_pack(_split_keep(sentence, _CLAUSE_END), max_chars))
    return _merge_short(pieces, max_chars)


def split_for_transition(pieces: list[str], wanted: int, min_chars: int = 12) -> list[str]:
    """Cut pieces further (at clause ends, then spaces) until there are ``wanted`` pieces or no
    piece can be cut into two of at least ``min_chars``. Used on a voice switch so that the A→B
    interpolation has pieces to step through even in a short utterance."""
    out = list(pieces)
    while len(out) < wanted:
        longest = max(range(len(out)), key=lambda i: len(out[i]))
        halves = _halve(out[longest], min_chars)
        if halves is None:
            break
        out[longest:longest + 1] = list(halves)
    return out


def _split_keep(text: str, pattern: re.Pattern[str]) -> list[str]:
    parts = [p.strip() for p in pattern.split(text)]
    return [p for p in parts if p]


def _pack(parts: list[str], max_chars: int) -> list[str]:
    """Greedily join clause parts up to ``max_chars``; parts still too long are cut at spaces or hard."""
    out: list[str] = []
    current = ""
    for part in parts:
        for chunk in _cut_long(part, max_chars):
            joined = _join(current, chunk)
            if current and len(joined) > max_chars:
                out.append(current)
                current = chunk
            else:
                current = joined
    if current:
        out.append(current)
    return out


def _cut_long(part: str, max_chars: int) -> list[str]:
    if len(part) <= max_chars:
        return [part]
    out: list[str] = []
    rest = part
    while len(rest) > max_chars:
        cut = rest.rfind(" ", 0, max_chars + 1)
        if cut <= 0:
            cut = max_chars  # no space (e.g. Chinese): a hard cut is the only option left
        out.append(rest[:cut].strip())
        rest = rest[cut:].strip()
    if rest:
        out.append(rest)
    return out


def _merge_short(pieces: list[str], max_chars: int) -> list[str]:
    """Join very short pieces ("Yes." "No.") with their neighbour: each piece is one GPT pass, and a
    pass has a fixed cost, so two-word pieces only add latency."""
    out: list[str] = []
    for piece in pieces:
        if out and (len(out[-1]) < 16 or len(piece) < 8) and len(_join(out[-1], piece)) <= max_chars:
            out[-1] = _join(out[-1], piece)
        else:
            out.append(piece)
    return out


def _halve(piece: str, min_chars: int) -> tuple[str, str] | None:
    middle = len(piece) // 2
    candidates = [m.end() for m in _CLAUSE_END.finditer(piece)] or [i + 1 for i, c in enumerate(piece) if c == " "]
    candidates = [c for c in candidates if min_chars <= c <= len(piece) - min_chars]
    if not candidates:
        return None
    cut = min(candidates, key=lambda c: abs(c - middle))
    return piece[:cut].strip(), piece[cut:].strip()


def _join(a: str, b: str) -> str:
    if not a:
        return b
    if _is_cjk(a[-1]) or _is_cjk(b[0]) or a[-1] in "，。！？；、：":
        return a + b
    return a + " " + b


def _is_cjk(char: str) -> bool:
    return "\u4e00" <= char <= "\u9fff"
