"""app/api/speech_takes.py fed entries by hand: a restarted line never puts audio twice into a body,
and nothing missing ever passes for whole."""

from __future__ import annotations

import numpy as np
import pytest
from app.api.speech_takes import Takes

from voxroom.errors import StreamGap, TakesDiffer


def line_audio(seed: int, slices: int, size: int = 960) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(-3000, 3000, size, dtype=np.int16) for _ in range(slices)]


def feed(takes: Takes, seq: int, audio: list[np.ndarray], out: list[np.ndarray], first: int = 0) -> None:
    for i, pcm in enumerate(audio, first):
        part = takes.audio(seq, i, pcm)
        if part.size:
            out.append(part)


def test_a_line_restarted_after_some_was_sent_goes_on_from_the_same_sample_when_the_takes_agree() -> None:
    take = line_audio(1, 10)
    takes = Takes()
    body: list[np.ndarray] = []
    assert takes.start(1, False) == (0, 0)
    feed(takes, 1, take[:4], body)
    takes.commit()  # four slices sent
    unsent: list[np.ndarray] = []
    feed(takes, 1, take[4:6], unsent, first=4)  # read, not sent: the worker dies here
    assert takes.start(1, True) == (2 * 960, 0), "the two unsent slices are dropped"
    feed(takes, 1, take, body)  # the second take, whole: its first four slices are checked and skipped
    takes.end(1, len(take))
    assert np.array_equal(np.concatenate(body), np.concatenate(take)), "the line once, whole, in order"


def test_a_restart_before_anything_of_the_line_was_sent_takes_the_new_take_whole_even_if_it_differs() -> None:
    takes = Takes()
    takes.start(1, False)
    unsent: list[np.ndarray] = []
    feed(takes, 1, line_audio(1, 3), unsent)
    assert takes.start(1, True) == (3 * 960, 0)
    body: list[np.ndarray] = []
    other = line_audio(2, 7)  # ChatTTS: another take altogether
    feed(takes, 1, other, body)
    takes.end(1, 7)
    assert np.array_equal(np.concatenate(body), np.concatenate(other))


def test_a_new_take_unlike_what_was_sent_fails_and_so_does_one_shorter_than_it() -> None:
    takes = Takes()
    takes.start(1, False)
    feed(takes, 1, line_audio(1, 4), [])
    takes.commit()
    takes.start(1, True)
    with pytest.raises(TakesDiffer):
        feed(takes, 1, line_audio(2, 8), [])
    takes = Takes()
    takes.start(1, False)
    feed(takes, 1, line_audio(1, 4), [])
    takes.commit()
    takes.start(1, True)
    feed(takes, 1, line_audio(1, 2), [])
    with pytest.raises(TakesDiffer):
        takes.end(1, 2)


def test_slices_cut_at_other_places_in_the_new_take_still_match() -> None:
    """The check is on samples, not slices: a take sliced differently goes on at the same sample."""
    whole = np.concatenate(line_audio(3, 6))
    takes = Takes()
    takes.start(1, False)
    body: list[np.ndarray] = []
    feed(takes, 1, np.split(whole, 6)[:2], body)
    takes.commit()
    takes.start(1, True)
    feed(takes, 1, np.array_split(whole, 5), body)
    takes.end(1, 5)
    assert np.array_equal(np.concatenate(body), whole)


def test_a_restart_skips_the_words_already_handed_out() -> None:
    takes = Takes()
    takes.start(1, False)
    assert takes.words(1, 3) == 0
    feed(takes, 1, line_audio(1, 2), [])
    takes.commit()
    assert takes.words(1, 2) == 0  # read after the commit: dropped by the restart
    assert takes.start(1, True) == (0, 2)
    assert takes.words(1, 4) == 3, "the new take's first three words were handed out already"
    assert takes.words(1, 2) == 0


@pytest.mark.parametrize("entries", [
    [("start", 2)],  # line 1 never seen
    [("start", 1), ("chunk", 1, 0), ("chunk", 1, 2)],  # chunk 1 missing
    [("start", 1), ("chunk", 1, 0), ("end", 1, 2)],  # the end counts a chunk never read
    [("start", 1), ("chunk", 1, 0), ("start", 2)],  # line 1's end missing
    [("start", 1), ("chunk", 1, 0), ("end", 1, 1), ("start", 3)],  # line 2 missing
    [("start", 1), ("chunk", 2, 0)],  # another line's audio
])
def test_anything_missing_is_a_gap(entries: list[tuple]) -> None:
    takes = Takes()
    pcm = line_audio(1, 1)[0]
    with pytest.raises(StreamGap):
        for kind, *args in entries:
            if kind == "start":
                takes.start(args[0], False)
            elif kind == "chunk":
                takes.audio(args[0], args[1], pcm)
            else:
                takes.end(args[0], args[1])
