"""What a listener must have received after ``lines`` lines were said in its room: each heard
whole (every chunk, first to last), once, in order, none restarted."""

from __future__ import annotations

from tests.support.room_client import Received


def assert_heard_whole_once_in_order(got: Received, lines: int) -> None:
    ends = got.ends()
    assert [e["utterance"] for e in ends] == list(range(1, lines + 1)), ends
    assert all(e["status"] == "ok" for e in ends), ends
    starts = got.of("start")
    assert [s["utterance"] for s in starts] == list(range(1, lines + 1)), starts
    assert not any(s.get("restart") for s in starts), starts
    for utterance in range(1, lines + 1):
        mine = got.frames_of(utterance)
        assert mine and [f.chunk for f in mine] == list(range(len(mine))), "chunks missing or doubled"
        assert mine[0].first and mine[-1].last
    assert [f.seq for f in got.frames] == sorted(f.seq for f in got.frames)
