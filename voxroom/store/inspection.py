"""What a room holds in Redis, read for the CLI (``voxroom rooms``, ``voxroom room ID``;
voxroom_cli/rooms.py renders it). Read-only: nothing here writes to Redis.

The same reads as the ``redis-cli`` recipes in docs/operations.md (``ZREVRANGE vx:rooms``,
``HGETALL vx:room:{id}:state``, ``XREVRANGE vx:room:{id}:utt`` (braces literal), ``XPENDING
vx:jobs workers``, ``XINFO GROUPS vx:jobs``), so an operator can check one against the other.
Every read is one key per command, so on a cluster redis-py's cluster client routes each to its
key's node; where the room index and the jobs lie (one ``vx:rooms`` and ``vx:jobs``, or a
cluster's shards of each, merged here) is the layout's (``voxroom.store.interface.Layout``).

Rooms expire (``VOXROOM_ROOM_IDLE_TTL_S`` after their last line): listings leave out index
entries older than that and rooms with no key left, even before a ``say`` has removed their
entry, and show when each room will be gone (``expires s``).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError

from voxroom.store import keys
from voxroom.store.interface import Layout

Client = Redis | RedisCluster
"""A synchronous redis-py client: one Redis, or a cluster found from any one node."""

PENDING_SCAN = 1000
"""How many pending jobs ``voxroom room`` looks through to find the room's (oldest first)."""


def _s(value: Any) -> str:
    if value is None:
        return ""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _fields(raw: dict[Any, Any]) -> dict[str, str]:
    return {_s(k): _s(v) for k, v in raw.items()}


@dataclass(frozen=True, slots=True)
class RoomSummary:
    room: str
    idle_s: float
    """Seconds since the room's last accepted ``say``."""
    last_seq: int
    next_seq: int
    voice: str
    utterances: int
    output_entries: int
    backlog_ms: float
    """Audio already published and not yet played (room-clock end minus now)."""
    expires_s: float
    """Seconds until the room's last key expires: ``inf`` when some key has no TTL (written before
    rooms expired), NaN when the room has no key left."""
    switch: str = ""
    """A voice switch spread over lines, still running: ``a -> b, next line 2 of 3`` (lines
    counted from 1); empty when none."""

    cancelled: frozenset[int] = frozenset()
    """Lines a ``cancel`` stopped, the room's last 32 (``:state`` ``cancelled_recent``)."""

    @property
    def gone(self) -> bool:
        """Nothing of the room is left in Redis (its ``vx:rooms`` entry is stale)."""
        return self.expires_s != self.expires_s

    @property
    def waiting(self) -> int:
        """Utterances accepted and not yet finished playing (the ``busy`` back-pressure count)."""
        return max(0, self.last_seq - self.next_seq + 1)


@dataclass(frozen=True, slots=True)
class PendingJob:
    entry_id: str
    seq: int
    consumer: str
    idle_ms: int
    deliveries: int


def room_keys(room: str) -> list[str]:
    """Every key a room can have (what expires with it; ``:opus`` has its own short TTL)."""
    return [keys.room_seq(room), keys.room_state(room), keys.room_utterances(room), keys.room_output(room),
            keys.room_senders(room)]


def _expires_s(pttls: Sequence[int]) -> float:
    """When the last of a room's keys goes: PTTL is -2 for a missing key, -1 for one without TTL."""
    if any(t == -1 for t in pttls):
        return float("inf")
    live = [t for t in pttls if t >= 0]
    return max(live) / 1000.0 if live else float("nan")


def room_summaries(r: Client, layout: Layout, room_ids: Sequence[str],
                   now_ms: float | None = None) -> list[RoomSummary]:
    now = time.time() * 1000.0 if now_ms is None else now_ms
    per_room = 5 + len(room_keys(""))  # five reads, then one PTTL per room key
    pipe = r.pipeline(transaction=False)
    for room in room_ids:
        pipe.zscore(layout.room_index(room), room)
        pipe.get(keys.room_seq(room))
        pipe.hgetall(keys.room_state(room))
        pipe.xlen(keys.room_utterances(room))
        pipe.xlen(keys.room_output(room))
        for key in room_keys(room):
            pipe.pttl(key)
    replies: list[Any] = pipe.execute()
    out = []
    for i, room in enumerate(room_ids):
        score, seq, state, n_utt, n_out = replies[per_room * i:per_room * i + 5]
        pttls = [int(t) for t in replies[per_room * i + 5:per_room * (i + 1)]]
        st = _fields(state or {})
        end_ms = float(st.get("end_ms") or 0.0)
        out.append(RoomSummary(
            room=room, idle_s=(now - float(score)) / 1000.0 if score is not None else float("nan"),
            last_seq=int(seq or 0), next_seq=int(st.get("next") or 1), voice=st.get("voice", ""),
            utterances=int(n_utt), output_entries=int(n_out), backlog_ms=max(0.0, end_ms - now),
            expires_s=_expires_s(pttls), switch=_switch(st),
            cancelled=frozenset(int(n) for n in st.get("cancelled_recent", "").split() if n.isdigit())))
    return out


def _switch(state: dict[str, str]) -> str:
    if not state.get("switch_from"):
        return ""
    line = int(state.get("switch_line") or 0) + 1
    return f"{state['switch_from']} -> {state.get('voice', '')}, next line {line} of {state.get('switch_lines', '?')}"


def list_rooms(r: Client, layout: Layout, limit: int = 50, *, idle_ttl_s: float | None = None,
               now_ms: float | None = None) -> list[RoomSummary]:
    """The ``limit`` most recently active rooms, newest first. With ``idle_ttl_s``, entries older
    than that are left out (stale: their keys expired, a later ``say`` removes the entry); rooms
    with no key left and private ``_api-`` rooms are always left out."""
    now = time.time() * 1000.0 if now_ms is None else now_ms
    low: float | str = "-inf" if idle_ttl_s is None else now - idle_ttl_s * 1000.0
    found: list[tuple[float, str]] = []
    for index in layout.room_indexes():  # each index's newest ``limit``, merged: the newest ``limit`` of all
        scored: Any = r.zrevrangebyscore(index, "+inf", low, start=0, num=max(1, limit), withscores=True)
        found += [(float(t), _s(x)) for x, t in scored]
    ids = [room for _, room in sorted(found, reverse=True)[:max(1, limit)]]
    ids = [room for room in ids if not room.startswith(keys.PRIVATE_ROOM_PREFIX)]
    return [s for s in room_summaries(r, layout, ids, now) if not s.gone]


def recent_utterances(r: Client, room: str, count: int = 10) -> list[dict[str, str]]:
    """The room's last ``count`` utterances, newest first (fields as the ``say`` script wrote them)."""
    entries: Any = r.xrevrange(keys.room_utterances(room), count=count)
    return [dict(_fields(f or {}), id=_s(i)) for i, f in entries]


def output_tail(r: Client, room: str, count: int = 10) -> list[dict[str, str]]:
    """The room's last output entries without their audio bytes: ``frame``, ``opus`` and a
    grouped entry's ``frame1``, ``opus1``... are binary, so a row gives their summed size as
    ``frame_bytes`` (and ``opus_bytes``) instead."""
    rows = []
    entries: Any = r.xrevrange(keys.room_output(room), count=count)
    for entry_id, raw in entries:
        fields = {_s(k): v for k, v in raw.items()}
        sizes: dict[str, int] = {}
        for name in [k for k in fields if k.startswith(("frame", "opus"))]:
            kind = "frame_bytes" if name.startswith("frame") else "opus_bytes"
            sizes[kind] = sizes.get(kind, 0) + len(fields.pop(name))
        row = {k: _s(v) for k, v in fields.items()}
        row["id"] = _s(entry_id)
        row.update((k, str(v)) for k, v in sizes.items())
        rows.append(row)
    return rows


def pending_jobs(r: Client, layout: Layout, room: str | None = None, scan: int = PENDING_SCAN) -> list[PendingJob]:
    """Jobs read by a worker and not acked (``XPENDING``), optionally only ``room``'s (of the job
    stream that holds the room's jobs, or of every job stream)."""
    streams = [layout.job_stream_of(room)] if room is not None else layout.job_streams()
    out = []
    for stream in streams:
        out += _pending(r, stream, room, scan)
    return out


def _pending(r: Client, stream: str, room: str | None, scan: int) -> list[PendingJob]:
    try:
        pending: Any = r.xpending_range(stream, keys.JOBS_GROUP, min="-", max="+", count=scan)
    except ResponseError as exc:  # NOGROUP before the first worker ever started
        if "NOGROUP" in str(exc) or "no such key" in str(exc):
            return []
        raise
    pipe = r.pipeline(transaction=False)
    for p in pending:
        entry_id = _s(p["message_id"])
        pipe.xrange(stream, min=entry_id, max=entry_id)
    entries: list[Any] = pipe.execute() if pending else []
    out = []
    for p, found in zip(pending, entries, strict=True):
        fields = _fields(found[0][1]) if found else {}
        if room is not None and fields.get("room") != room:
            continue
        out.append(PendingJob(entry_id=_s(p["message_id"]), seq=int(fields.get("seq") or 0),
                              consumer=_s(p["consumer"]), idle_ms=int(p["time_since_delivered"]),
                              deliveries=int(p["times_delivered"])))
    return out


def job_groups(r: Client, layout: Layout) -> list[dict[str, str]]:
    """``XINFO GROUPS vx:jobs``: per consumer group, pending and lag (lag is Redis 7 only). With
    several job streams (a cluster's shards) one row per stream that has a group, its ``name`` the
    stream's key."""
    streams = layout.job_streams()
    out = []
    for stream in streams:
        try:
            groups = [_fields(g) for g in r.xinfo_groups(stream)]
        except ResponseError as exc:
            if "no such key" in str(exc):
                continue
            raise
        if len(streams) > 1:
            groups = [dict(g, name=stream) for g in groups]
        out += groups
    return out


def workers(r: Client) -> dict[str, dict[str, str]]:
    """Live workers' heartbeats. Ids come from the ``vx:workers`` registry; a keyspace SCAN only
    when it is empty (workers older than the registry)."""
    ids = [_s(x) for x in r.zrange(keys.WORKERS, 0, -1)]
    if not ids:
        ids = [_s(key).rsplit(":", 1)[-1] for key in r.scan_iter(match=keys.worker_pattern(), count=100)]
    pipe = r.pipeline(transaction=False)
    for worker_id in ids:
        pipe.hgetall(keys.worker_heartbeat(worker_id))
    beats: list[Any] = pipe.execute() if ids else []
    return {worker_id: _fields(hb) for worker_id, hb in zip(ids, beats, strict=True) if hb}


class RoomInspection:
    """The reads above on one client and layout (``voxroom.store.opening.open_inspection``);
    closes the client on exit."""

    def __init__(self, client: Client, layout: Layout) -> None:
        self.client = client
        self.layout = layout

    def __enter__(self) -> RoomInspection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.client.close()

    def list_rooms(self, limit: int = 50, *, idle_ttl_s: float | None = None,
                   now_ms: float | None = None) -> list[RoomSummary]:
        return list_rooms(self.client, self.layout, limit, idle_ttl_s=idle_ttl_s, now_ms=now_ms)

    def room_summaries(self, room_ids: Sequence[str], now_ms: float | None = None) -> list[RoomSummary]:
        return room_summaries(self.client, self.layout, room_ids, now_ms)

    def recent_utterances(self, room: str, count: int = 10) -> list[dict[str, str]]:
        return recent_utterances(self.client, room, count)

    def output_tail(self, room: str, count: int = 10) -> list[dict[str, str]]:
        return output_tail(self.client, room, count)

    def pending_jobs(self, room: str | None = None, scan: int = PENDING_SCAN) -> list[PendingJob]:
        return pending_jobs(self.client, self.layout, room, scan)

    def job_groups(self) -> list[dict[str, str]]:
        return job_groups(self.client, self.layout)

    def workers(self) -> dict[str, dict[str, str]]:
        return workers(self.client)
