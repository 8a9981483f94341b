"""Each Lua script is written once (voxroom/store/lua/); where the two Redis modes differ, a small
named piece does. Here every script that has a mode piece runs in both modes on the same input,
on one real redis-server 7 (database 0 as one Redis would hold the room, database 1 as a cluster
node would: the scripts touch one slot, so a plain server runs both), and what they leave in the
room's keys is compared. The differences allowed are the mode's own: where the job goes (``vx:jobs``
on one Redis, the room's log for its shard's hand-off on a cluster), the cluster's hand-off
fields in ``:state`` (``epoch``, ``handed``, ``shard``) and its owner field (the fence), and the
bell (``SPUBLISH``) a cluster rings."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import redis

from voxroom.store import keys
from voxroom.store.lua import say
from voxroom.store.lua.room import CLUSTER, SINGLE, RoomScripts
from voxroom.store.server import RedisServer

SHARD = 5
EPOCH = "1700000000000-abcd"
CONSUMER = "w-1"


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with RedisServer() as srv:
        yield srv


@pytest.fixture
def dbs(server: RedisServer) -> Iterator[tuple[redis.Redis, redis.Redis]]:
    single = redis.Redis(port=server.port, db=0, decode_responses=True)
    cluster = redis.Redis(port=server.port, db=1, decode_responses=True)
    single.flushall()
    yield single, cluster
    single.close()
    cluster.close()


def _argv(room: str, seq: int, text: str, voice: str, now_ms: int, *, lexicon: str = "", pending: int = 16,
          switch_lines: int = 3, to: str = "", opened: bool = False) -> list[Any]:
    """``say.SINGLE``'s ARGV, as voxroom/store/single/ingress.py builds it."""
    return ["alice", seq, text, voice, now_ms, 1000, 100_000, room, pending, 3600, now_ms - 3_600_000, 64,
            switch_lines, lexicon, to, "1" if opened else "", len(text)]


def _say_single(r: redis.Redis, room: str, argv: list[Any]) -> Any:
    return r.eval(say.SINGLE, 8, keys.room_senders(room), keys.room_seq(room), keys.room_utterances(room),
                  keys.JOBS, keys.room_state(room), keys.ROOMS, keys.room_output(room),
                  keys.open_line(room, argv[0], argv[1]), *argv)


def _say_cluster(r: redis.Redis, room: str, argv: list[Any]) -> Any:
    """As voxroom/store/cluster/ingress.py's accept: ARGV 7 the epoch, 11 the shard, 12 unused."""
    argv = list(argv)
    argv[6], argv[10], argv[11] = EPOCH, SHARD, ""
    return r.eval(say.CLUSTER, 6, keys.room_senders(room), keys.room_seq(room), keys.room_utterances(room),
                  keys.room_output(room), keys.room_state(room), keys.open_line(room, argv[0], argv[1]), *argv)


def _entries(r: redis.Redis, key: str) -> list[dict[str, str]]:
    return [fields for _id, fields in r.xrange(key)]


def test_say_leaves_the_same_room_in_both_modes(dbs: tuple[redis.Redis, redis.Redis]) -> None:
    single, cluster = dbs
    room = "both"
    lines = [  # first line, a duplicate, a voice switch over three lines, a line with its own
        # lexicon, a private line
        _argv(room, 1, "The night falls.", "a", 1000),
        _argv(room, 1, "The night falls.", "a", 1001),
        _argv(room, 2, "Wolves, wake up.", "b", 1002),
        _argv(room, 3, "Choose.", "b", 1003, lexicon='{"GM":"game master"}'),
        _argv(room, 4, "Sleep.", "b", 1004),
        _argv(room, 5, "Seer, she is a wolf.", "b", 1005, to="carol seer"),
    ]
    replies_single = [_say_single(single, room, argv) for argv in lines]
    replies_cluster = [_say_cluster(cluster, room, argv) for argv in lines]
    # The same answers: accepted with the same room number, or duplicate of the same seq.
    assert [r[:2] for r in replies_single] == [r[:2] for r in replies_cluster] == [
        [1, 1], [0, 1], [1, 2], [1, 3], [1, 4], [1, 5]]
    assert single.get(keys.room_seq(room)) == cluster.get(keys.room_seq(room)) == "5"
    assert single.hgetall(keys.room_senders(room)) == cluster.hgetall(keys.room_senders(room)) == {"alice": "5"}
    state_single, state_cluster = single.hgetall(keys.room_state(room)), cluster.hgetall(keys.room_state(room))
    assert {k: state_cluster.pop(k) for k in ("epoch", "handed", "shard")} == {
        "epoch": EPOCH, "handed": "0", "shard": str(SHARD)}  # the hand-off's (nothing handed yet)
    assert state_single == state_cluster
    # The room's log: the cluster keeps every field a job needs there (its hand-off reads them),
    # the one instance the readable ones; where both have a field it holds the same.
    log_single, log_cluster = _entries(single, keys.room_utterances(room)), _entries(cluster, keys.room_utterances(room))
    assert len(log_single) == len(log_cluster) == 5
    for one, other in zip(log_single, log_cluster, strict=True):
        assert one == {k: other[k] for k in one}
    # The job: written by the one-instance script, handed from the log on a cluster. Same fields.
    jobs = _entries(single, keys.JOBS)
    assert [dict(job, room=room) for job in jobs] == jobs
    assert [{k: v for k, v in job.items() if k != "room"} for job in jobs] == [
        {k: v for k, v in entry.items() if k != "client_seq"} for entry in log_cluster]
    assert [job.get("switch_line") for job in jobs] == [None, "0", "1", "2", None]
    # The private line's audience, in the log (``voxroom room``) and the job (its worker's entries).
    assert [job.get("to") for job in jobs] == [None, None, None, None, "carol seer"]
    assert log_single[-1]["to"] == log_cluster[-1]["to"] == "carol seer"
    assert cluster.exists(keys.JOBS) == 0
    # TTLs on the same keys (one instance also keeps vx:rooms; a cluster indexes rooms elsewhere).
    for key in (keys.room_senders(room), keys.room_seq(room), keys.room_utterances(room), keys.room_state(room)):
        assert single.ttl(key) > 0 and cluster.ttl(key) > 0, key
    assert single.zscore(keys.ROOMS, room) == 1005


def test_busy_is_the_same_in_both_modes(dbs: tuple[redis.Redis, redis.Redis]) -> None:
    single, cluster = dbs
    room = "full"
    for seq in range(1, 5):
        argv = _argv(room, seq, f"Line {seq}.", "a", 2000 + seq, pending=3)
        assert _say_single(single, room, argv)[:2] == _say_cluster(cluster, room, argv)[:2]
    assert _say_single(single, room, _argv(room, 5, "x", "a", 3000, pending=3)) == [-1, 3]
    assert _say_cluster(cluster, room, _argv(room, 5, "x", "a", 3000, pending=3)) == [-1, 3]


# -- the room writes: publish, skip, finish, release, with each mode's fence ----------------------


class _Mode:
    """One mode's fence set up for one job of ``room`` (seq 1), and the room scripts with it."""

    def __init__(self, r: redis.Redis, fence: str, room: str) -> None:
        self.r = r
        self.room = room
        self.scripts = RoomScripts(fence)
        if fence is SINGLE:
            r.xgroup_create(keys.JOBS, keys.JOBS_GROUP, id="0", mkstream=True)
            self.entry = r.xadd(keys.JOBS, {"room": room, "seq": 1})
            r.xreadgroup(keys.JOBS_GROUP, CONSUMER, {keys.JOBS: ">"})
            self.fence_key, self.a, self.b = keys.JOBS, self.entry, CONSUMER
        else:
            r.hset(keys.room_state(room), "owner:1", f"1|{CONSUMER}|{SHARD}/1-0")
            self.fence_key, self.a, self.b = keys.room_state(room), "owner:1", f"1|{CONSUMER}|{SHARD}/1-0"

    def publish(self, entries: list[dict[str, Any]], *, b: str | None = None, started: str = "",
                final: bool = False) -> Any:
        argv: list[Any] = [120_000, 3600, self.a, self.b if b is None else b, 1, "0", started, "1",
                           "1" if final else "0", len(entries)]
        for fields in entries:
            argv.append(len(fields))
            for name, value in fields.items():
                argv += [name, value]
        return self.r.eval(self.scripts.publish, 3, self.fence_key, keys.room_output(self.room),
                           keys.room_state(self.room), *argv)[0]

    def finish(self, *, b: str | None = None, cut: bool = False) -> Any:
        return self.r.eval(self.scripts.finish, 3, self.fence_key, keys.room_output(self.room),
                           keys.room_state(self.room), self.a, self.b if b is None else b, 120_000, 3600, "0", 2,
                           "1234.000", "1" if cut else "0", "kind", "end", "seq", 1,
                           "status", "cancelled" if cut else "ok")

    def pass_turn(self) -> Any:
        return self.r.eval(self.scripts.pass_turn, 3, self.fence_key, keys.room_output(self.room),
                           keys.room_state(self.room), self.a, self.b, 1)

    def cancel(self, what: str, number: int | str, who: str, *, host: bool = False) -> Any:
        return self.r.eval(self.scripts.cancel, 4, keys.room_state(self.room), keys.room_utterances(self.room),
                           keys.room_seq(self.room), keys.room_output(self.room), what, number, who,
                           "1" if host else "0")

    def skip(self, seq: int) -> Any:
        return self.r.eval(self.scripts.skip, 2, self.fence_key, keys.room_state(self.room), self.a, self.b, seq)

    def release(self) -> Any:
        return self.r.eval(self.scripts.release, 2, self.fence_key, keys.room_state(self.room), self.a, self.b)


def _modes(dbs: tuple[redis.Redis, redis.Redis], room: str) -> list[_Mode]:
    return [_Mode(dbs[0], SINGLE, room), _Mode(dbs[1], CLUSTER, room)]


def test_publish_and_finish_leave_the_same_room_in_both_modes(dbs: tuple[redis.Redis, redis.Redis]) -> None:
    for mode in _modes(dbs, "spoken"):
        with mode.r.pubsub() as bell:  # a cluster rings the room's bell once per line per script
            bell.ssubscribe(keys.room_bell(mode.room))
            assert mode.publish([{"kind": "start", "seq": 1}, {"kind": "chunk", "seq": 1, "chunk": 0}],
                                started="1") == 1
            assert mode.publish([{"kind": "chunk", "seq": 1, "chunk": 1}], b="somebody-else") == 0
            assert mode.finish(b="somebody-else") == 0
            assert mode.finish() == 1
            assert mode.finish() == 0  # done: no longer this worker's, in either mode
            rings = [m for m in iter(lambda: bell.get_sharded_message(timeout=0.2), None) if m["type"] == "smessage"]
        assert len(rings) == (2 if mode.scripts.publish.startswith(CLUSTER) else 0)
    (single, cluster) = dbs
    out = [_entries(r, keys.room_output("spoken")) for r in (single, cluster)]
    assert out[0] == out[1] == [{"kind": "start", "seq": "1"}, {"kind": "chunk", "seq": "1", "chunk": "0"},
                                {"kind": "end", "seq": "1", "status": "ok"}]
    state = [r.hgetall(keys.room_state("spoken")) for r in (single, cluster)]
    assert state[0] == state[1] == {"next": "2", "end_ms": "1234.000", "started": "1"}  # owner field gone
    assert single.xpending(keys.JOBS, keys.JOBS_GROUP)["pending"] == 0  # acked with the end
    for r in (single, cluster):
        assert r.ttl(keys.room_output("spoken")) > 0 and r.ttl(keys.room_state("spoken")) > 0


def test_the_turn_fence_and_the_skip_are_the_same_in_both_modes(dbs: tuple[redis.Redis, redis.Redis]) -> None:
    for mode in _modes(dbs, "skipped"):
        assert mode.publish([{"kind": "start", "seq": 1}], started="1") == 1
        mode.r.hset(keys.room_state(mode.room), "next", 2)  # a later line skipped past this one
        assert mode.publish([{"kind": "chunk", "seq": 1, "chunk": 0}]) == -1
        assert mode.finish() == -1
        assert mode.skip(5) == 1 and mode.skip(3) == 1  # next only moves forward
        assert mode.release() == 1 and mode.release() == 0
    single, cluster = dbs
    assert _entries(single, keys.room_output("skipped")) == _entries(cluster, keys.room_output("skipped")) == [
        {"kind": "start", "seq": "1"}]
    assert single.hgetall(keys.room_state("skipped")) == cluster.hgetall(keys.room_state("skipped")) == {
        "next": "5", "started": "1"}
    assert single.xpending(keys.JOBS, keys.JOBS_GROUP)["pending"] == 0  # released: acked


def test_a_line_never_stored_is_stored_when_resent_after_a_later_one_in_both_modes(
        dbs: tuple[redis.Redis, redis.Redis]) -> None:
    """``duplicate`` means stored: seq 2 was refused (it never reached Redis) while 3 was stored;
    resent, 2 is stored (after 3: the room's one order) and only then a duplicate; 1 and 3, stored,
    are duplicates; a seq more than ``GAPS_KEPT`` below the last is neither: nobody can tell whether
    it was stored, so it is refused (``seq_too_old``, -2), never answered ``duplicate``."""
    single, cluster = dbs
    room = "resent"
    sequence = [(1, 1), (3, 1), (2, 1), (2, 0), (1, 0), (3, 0), (100, 1), (50, -2), (90, 1), (90, 0), (68, -2), (69, 1)]
    for r, say_it in ((single, _say_single), (cluster, _say_cluster)):
        got = [say_it(r, room, _argv(room, seq, f"Line {seq}.", "a", 5000 + i))[0]
               for i, (seq, _) in enumerate(sequence)]
        assert got == [status for _, status in sequence], r
    # The room heard each stored seq once, in the order stored.
    assert [int(e["client_seq"]) for e in _entries(single, keys.room_utterances(room))] == [1, 3, 2, 100, 90, 69]
    assert [int(e["client_seq"]) for e in _entries(cluster, keys.room_utterances(room))] == [1, 3, 2, 100, 90, 69]
    assert single.hgetall(keys.room_senders(room)) == cluster.hgetall(keys.room_senders(room))
    gaps = single.hget(keys.room_senders(room), "alice|gaps")
    assert gaps is not None and sorted(map(int, gaps.split())) == [n for n in range(70, 100) if n != 90]


def _two_lines(r: redis.Redis, room: str) -> None:
    """Lines 1 (alice's say seq 7) and 2 (bob's seq 3) accepted, as the say script leaves them."""
    r.set(keys.room_seq(room), 2)
    r.xadd(keys.room_utterances(room), {"seq": 1, "text": "one", "sender": "alice", "client_seq": 7})
    r.xadd(keys.room_utterances(room), {"seq": 2, "text": "two", "sender": "bob", "client_seq": 3})


def test_cancel_finds_and_refuses_the_same_lines_in_both_modes(dbs: tuple[redis.Redis, redis.Redis]) -> None:
    """Issue 30: who may cancel which line, by room number, by say seq, or all of them."""
    for mode in _modes(dbs, "cancels"):
        _two_lines(mode.r, mode.room)
        assert mode.cancel("utterance", 9, "alice") == [-1]  # no such line
        assert mode.cancel("utterance", 2, "alice") == [-2]  # bob's, and alice is no host
        assert mode.cancel("seq", 3, "alice") == [-1]  # alice never said seq 3
        assert mode.cancel("seq", 7, "alice") == [1, 1]
        assert mode.cancel("all", "", "carol") == [1]  # nothing of carol's: found nothing, no error
        assert mode.cancel("all", "", "carol", host=True) == [1, 2]  # line 1 is cancelled already
        assert mode.r.hget(keys.room_state(mode.room), "cancelled") == "1 2"
        assert mode.cancel("utterance", 1, "carol", host=True) == [-1]  # cancelled already: not found
        mode.r.hset(keys.room_state(mode.room), "next", 3)  # both finished
        assert mode.cancel("utterance", 1, "alice") == [-1]
    single, cluster = dbs
    out = [_entries(r, keys.room_output("cancels")) for r in (single, cluster)]
    assert out[0] == out[1] == [{"kind": "cancel", "utterances": "1"}, {"kind": "cancel", "utterances": "2"}]


def test_a_cancelled_line_is_cut_or_passed_the_same_in_both_modes(dbs: tuple[redis.Redis, redis.Redis]) -> None:
    for mode in _modes(dbs, "cut"):
        _two_lines(mode.r, mode.room)
        assert mode.publish([{"kind": "start", "seq": 1}, {"kind": "chunk", "seq": 1, "chunk": 0}],
                            started="1") == 1
        assert mode.cancel("utterance", 1, "alice") == [1, 1]
        assert mode.publish([{"kind": "chunk", "seq": 1, "chunk": 1}]) == -2  # refused: cancelled
        assert mode.finish() == -2  # an ok end too
        assert mode.publish([{"kind": "chunk", "seq": 1, "chunk": 1, "fade": 1}], final=True) == 1
        assert mode.finish(cut=True) == 1
        assert mode.pass_turn() in (0, -1)  # done already
    single, cluster = dbs
    out = [_entries(r, keys.room_output("cut")) for r in (single, cluster)]
    assert out[0] == out[1] == [
        {"kind": "start", "seq": "1"}, {"kind": "chunk", "seq": "1", "chunk": "0"},
        {"kind": "cancel", "utterances": "1"}, {"kind": "chunk", "seq": "1", "chunk": "1", "fade": "1"},
        {"kind": "end", "seq": "1", "status": "cancelled"}]
    state = [r.hgetall(keys.room_state("cut")) for r in (single, cluster)]
    assert state[0] == state[1] == {"next": "2", "end_ms": "1234.000", "started": "1",
                                      "cancelled_recent": "1"}  # not cancelled any more; shown as cut


def test_a_line_cancelled_before_it_began_is_passed_the_same_in_both_modes(
        dbs: tuple[redis.Redis, redis.Redis]) -> None:
    for mode in _modes(dbs, "passed"):
        _two_lines(mode.r, mode.room)
        assert mode.cancel("utterance", 1, "alice") == [1, 1]
        assert mode.publish([{"kind": "start", "seq": 1}], started="1") == -2
        assert mode.pass_turn() == 1
        assert mode.pass_turn() == 0  # done: no longer this worker's
    single, cluster = dbs
    out = [_entries(r, keys.room_output("passed")) for r in (single, cluster)]
    assert out[0] == out[1] == [{"kind": "cancel", "utterances": "1"}, {"kind": "pass", "seq": "1"}]
    assert single.hgetall(keys.room_state("passed")) == cluster.hgetall(keys.room_state("passed")) == {"next": "2",
                                                                                         "cancelled_recent": "1"}
    assert single.xpending(keys.JOBS, keys.JOBS_GROUP)["pending"] == 0  # passed: acked
