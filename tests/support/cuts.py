"""What a cancelled line looks like to a room client (issue 30), for the tests of ``cancel`` on one
Redis (tests/gateway/test_cancel.py) and on a Cluster (tests/cluster/test_cluster_cancel.py)."""

from __future__ import annotations

from typing import Any

import numpy as np

from tests.support.room_client import Received, RoomClient
from voxroom.wire.protocol import SLICE_SAMPLES


def reply_to(got: Received, kind: str, at: int) -> dict[str, Any] | None:
    return next((m for m in got.messages[at:] if m.get("type") in (kind, "error")), None)


async def cancel(client: RoomClient, **what: Any) -> dict[str, Any]:
    """Send a ``cancel`` and return its answer: ``cancelled`` or the ``error``."""
    at = len(client.got.messages)
    await client.send_json({"type": "cancel", **what})
    await client.wait_for(lambda g: reply_to(g, "cancelled", at) is not None, 15)
    reply = reply_to(client.got, "cancelled", at)
    assert reply is not None
    return reply


def ends_of(got: Received, utterance: int) -> list[dict[str, Any]]:
    return [e for e in got.ends() if e["utterance"] == utterance]


def pcm_of(got: Received, utterance: int) -> list[np.ndarray]:
    return [np.frombuffer(f.payload, dtype="<i2") for f in got.frames_of(utterance)]


def assert_cut(got: Received, utterance: int) -> int:
    """The line's slices 0..n-1, no more, one ``end`` ``cancelled`` with ``chunks`` n, the last
    slice fading to silence within 10 ms. Returns n."""
    [end] = ends_of(got, utterance)
    assert end["status"] == "cancelled", end
    frames = got.frames_of(utterance)
    assert [f.chunk for f in frames] == list(range(end["chunks"])), (end, [f.chunk for f in frames])
    assert frames[-1].last and frames[-1].samples == SLICE_SAMPLES
    last = pcm_of(got, utterance)[-1].astype(np.int32)
    fade = SLICE_SAMPLES * 10 // 40  # 10 ms of the 40 ms slice
    assert not last[fade:].any(), "the cut slice is silent after its fade"
    assert abs(last[fade - 12:fade]).max() <= max(64, abs(last[:12]).max() // 4), "it fades out"
    # No frame of the line after its end, nothing of it twice.
    end_at = next(i for i, m in enumerate(got.stream) if isinstance(m, dict) and m.get("type") == "end"
                  and m["utterance"] == utterance)
    assert not [m for m in got.stream[end_at:] if not isinstance(m, dict) and m.seq == utterance]
    return int(end["chunks"])


def assert_whole(got: Received, utterance: int) -> None:
    [end] = ends_of(got, utterance)
    assert end["status"] == "ok", end
    frames = got.frames_of(utterance)
    assert [f.chunk for f in frames] == list(range(end["chunks"])) and frames[-1].last
