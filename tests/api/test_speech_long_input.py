"""Input up to OpenAI's 4096 characters: split by the sentence splitter into lines of at most the
room limit, said in order in one private room, streamed as one body."""

from __future__ import annotations

import time

import httpx
import numpy as np

from app.api.speech_room import MAX_INPUT_CHARS, split_input
from tests.conftest import Stack
from voxroom.wire.protocol import MAX_TEXT_CHARS

SENTENCES = ["The lantern swung once in the wind.", "Nobody in the village slept that night.",
             "At dawn the elder counted the houses, and one door stood open.",
             "They followed the tracks to the river, where the snow was trampled flat.",
             "Who among us, she asked, walked out after the bell?"]


def envelope(pcm: bytes) -> np.ndarray:
    """Loudness per 40 ms slice."""
    audio = np.frombuffer(pcm, dtype="<i2").astype(np.float64)
    usable = audio[: audio.size // 960 * 960].reshape(-1, 960)
    return np.asarray(np.sqrt((usable ** 2).mean(axis=1)))


def best_match(whole: np.ndarray, part: np.ndarray, offset: int, slack: int = 4) -> float:
    """The best correlation of ``part`` with ``whole`` near ``offset`` (in slices)."""
    best = -1.0
    for start in range(max(0, offset - slack), offset + slack + 1):
        window = whole[start:start + part.size]
        if window.size == part.size:
            best = max(best, float(np.corrcoef(window, part)[0, 1]))
    return best


def long_text(chars: int) -> str:
    out = ""
    n = 0
    while True:
        sentence = f"{SENTENCES[n % len(SENTENCES)][:-1]}, said voice {n}."
        if len(out) + 1 + len(sentence) > chars:
            return out
        out = f"{out} {sentence}".strip()
        n += 1


def test_the_splitter_keeps_every_word_in_order_in_lines_within_the_room_limit() -> None:
    text = long_text(MAX_INPUT_CHARS)
    lines = split_input(text)
    assert all(0 < len(line) <= MAX_TEXT_CHARS for line in lines)
    assert len(lines) <= 2 * MAX_INPUT_CHARS // MAX_TEXT_CHARS  # packed, not a line per sentence
    assert " ".join(lines).split() == text.split()
    assert split_input("Short.") == ["Short."]


async def test_a_4096_character_input_is_one_continuous_body_of_its_lines_in_order(stack: Stack) -> None:
    text = long_text(MAX_INPUT_CHARS)
    assert MAX_INPUT_CHARS - 80 < len(text) <= MAX_INPUT_CHARS
    lines = split_input(text)
    assert len(lines) >= 8
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=120) as http:
        started = time.monotonic()
        whole = await http.post("/v1/audio/speech", json={"input": text, "voice": "en-espeak",
                                                          "response_format": "pcm"})
        assert whole.status_code == 200, whole.text[:300]
        # Each line alone (now from the worker's audio cache: the same samples): the long body must
        # be exactly these, one after another, in the input's order.
        parts = []
        for line in lines:
            resp = await http.post("/v1/audio/speech", json={"input": line, "voice": "en-espeak",
                                                              "response_format": "pcm"})
            assert resp.status_code == 200
            parts.append(resp.content)
    assert all(len(p) > 2 * 24_000 for p in parts), "each line is seconds of audio"
    whole_env = envelope(whole.content)
    envs = [envelope(p) for p in parts]
    assert abs(whole_env.size - sum(e.size for e in envs)) <= 2 * len(parts), "the lines, no more, no less"
    # Where each line's audio sits in the long body: its own envelope matches there, in order
    # (within a few slices: an utterance's edge may differ by a slice), and another line's does not.
    offset = 0
    for i, env in enumerate(envs):
        own = best_match(whole_env, env, offset)
        others = [best_match(whole_env, other[:env.size], offset) for k, other in enumerate(envs) if k != i]
        assert own > 0.6 and own > max(others) + 0.2, (i, own, max(others))
        offset += env.size
    print(f"{len(text)} characters, {len(lines)} lines, {len(whole.content) / 48_000:.1f} s of audio "
          f"in {time.monotonic() - started:.1f} s")
