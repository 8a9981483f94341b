"""``voxroom rooms`` and ``voxroom room ID``: what a room holds in Redis, as readable tables.

The same reads as the ``redis-cli`` recipes in docs/operations.md (``ZREVRANGE vx:rooms``,
``HGETALL vx:room:{id}:state``, ``XREVRANGE vx:room:{id}:utt`` (braces literal), ``XPENDING vx:jobs workers``,
``XINFO GROUPS vx:jobs``), so an operator can check one against the other. Read-only: nothing here
writes to Redis.

Rooms expire (``VOXROOM_ROOM_IDLE_TTL_S`` after their last line, see app/ingress.py): listings leave
out ``vx:rooms`` entries older than that and rooms with no key left, even before a ``say`` has
removed their entry, and show when each room will be gone (``expires s``).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from redis import Redis
from redis.cluster import RedisCluster
from redis.exceptions import ResponseError

from voxroom import keys
from voxroom.backoff import REDIS_DOWN
from voxroom.errors import VoxroomError
from voxroom.protocol import valid_room_id
from voxroom.settings import Settings

Client = Redis | RedisCluster
"""One Redis, or a Redis Cluster found from any one node (docs/cluster.md): every read below is
one key per command, so redis-py's cluster client routes each to the node holding its slot. On a
cluster ``vx:rooms`` is ``shards`` index shards (``vx:rooms:{r<k>}``, merged here) and ``vx:jobs``
as many job shards (``vx:jobs:{j<k>}``); ``shards`` is ``VOXROOM_JOB_SHARDS``."""

DEFAULT_SHARDS = Settings().job_shards

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


def _index(r: Client, room: str, shards: int) -> str:
    """The listing index that holds ``room``: ``vx:rooms``, or its shard on a cluster."""
    return keys.rooms_shard(keys.shard_of(room, shards)) if isinstance(r, RedisCluster) else keys.ROOMS


def _job_streams(r: Client, shards: int) -> list[str]:
    return [keys.job_shard(k) for k in range(shards)] if isinstance(r, RedisCluster) else [keys.JOBS]


def room_summaries(r: Client, room_ids: Sequence[str], now_ms: float | None = None, *,
                   shards: int = DEFAULT_SHARDS) -> list[RoomSummary]:
    now = time.time() * 1000.0 if now_ms is None else now_ms
    per_room = 5 + len(room_keys(""))  # five reads, then one PTTL per room key
    pipe = r.pipeline(transaction=False)
    for room in room_ids:
        pipe.zscore(_index(r, room, shards), room)
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
            expires_s=_expires_s(pttls), switch=_switch(st)))
    return out


def _switch(state: dict[str, str]) -> str:
    if not state.get("switch_from"):
        return ""
    line = int(state.get("switch_line") or 0) + 1
    return f"{state['switch_from']} -> {state.get('voice', '')}, next line {line} of {state.get('switch_lines', '?')}"


def list_rooms(r: Client, limit: int = 50, *, idle_ttl_s: float | None = None,
               now_ms: float | None = None, shards: int = DEFAULT_SHARDS) -> list[RoomSummary]:
    """The ``limit`` most recently active rooms, newest first. With ``idle_ttl_s``, entries older
    than that are left out (stale: their keys expired, a later ``say`` removes the entry); rooms
    with no key left and private ``_api-`` rooms are always left out."""
    now = time.time() * 1000.0 if now_ms is None else now_ms
    low: float | str = "-inf" if idle_ttl_s is None else now - idle_ttl_s * 1000.0
    if isinstance(r, RedisCluster):
        found: list[tuple[float, str]] = []
        for k in range(shards):  # each shard's newest ``limit``, merged: the newest ``limit`` of all
            scored: Any = r.zrevrangebyscore(keys.rooms_shard(k), "+inf", low, start=0, num=max(1, limit),
                                             withscores=True)
            found += [(float(t), _s(x)) for x, t in scored]
        ids = [room for _, room in sorted(found, reverse=True)[:max(1, limit)]]
    else:
        ids = [_s(x) for x in r.zrevrangebyscore(keys.ROOMS, "+inf", low, start=0, num=max(1, limit))]
    ids = [room for room in ids if not room.startswith(keys.PRIVATE_ROOM_PREFIX)]
    return [s for s in room_summaries(r, ids, now, shards=shards) if not s.gone]


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


def pending_jobs(r: Client, room: str | None = None, scan: int = PENDING_SCAN, *,
                 shards: int = DEFAULT_SHARDS) -> list[PendingJob]:
    """Jobs read by a worker and not acked (``XPENDING``), optionally only ``room``'s (on a
    cluster: of the room's job shard only, or of every shard)."""
    if isinstance(r, RedisCluster):
        streams = [keys.job_shard(keys.shard_of(room, shards))] if room is not None else _job_streams(r, shards)
    else:
        streams = [keys.JOBS]
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


def job_groups(r: Client, *, shards: int = DEFAULT_SHARDS) -> list[dict[str, str]]:
    """``XINFO GROUPS vx:jobs``: per consumer group, pending and lag (lag is Redis 7 only). On a
    cluster one row per job shard that has a group, its ``name`` the shard's key."""
    out = []
    for stream in _job_streams(r, shards):
        try:
            groups = [_fields(g) for g in r.xinfo_groups(stream)]
        except ResponseError as exc:
            if "no such key" in str(exc):
                continue
            raise
        if isinstance(r, RedisCluster):
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


# -- rendering -----------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain fixed-width table (no colour, no box drawing: it is read in terminals and logs)."""
    cells = [[str(h) for h in headers]] + [[_cell(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _cell(value: object) -> str:
    if isinstance(value, float):
        if value == float("inf"):
            return "never"
        return "-" if value != value else f"{value:.1f}"  # NaN: never active
    text = str(value)
    return text if len(text) <= 48 else text[:45] + "..."


def render_rooms(rooms: Sequence[RoomSummary], groups: Sequence[dict[str, str]],
                 live_workers: dict[str, dict[str, str]]) -> str:
    parts = [table(["room", "idle s", "last seq", "next", "waiting", "backlog ms", "voice", "utt log", "out",
                    "expires s"],
                   [[s.room, s.idle_s, s.last_seq, s.next_seq, s.waiting, s.backlog_ms, s.voice, s.utterances,
                     s.output_entries, s.expires_s] for s in rooms]) if rooms else "no rooms"]
    parts.append("")
    parts.append(table(["job group", "consumers", "pending", "lag", "last delivered"],
                       [[g.get("name"), g.get("consumers"), g.get("pending"), g.get("lag", "?"),
                         g.get("last-delivered-id")] for g in groups]) if groups else "no job group yet")
    parts.append("")
    parts.append(table(["worker", "engines", "contexts", "load", "free", "published", "rtf"],
                       [[w, hb.get("engines"), hb.get("contexts"), hb.get("load"), hb.get("free"),
                         hb.get("published"), hb.get("rtf")] for w, hb in sorted(live_workers.items())])
                 if live_workers else "no live worker")
    return "\n".join(parts)


def render_room(summary: RoomSummary, utterances: Sequence[dict[str, str]], pending: Sequence[PendingJob],
                output: Sequence[dict[str, str]]) -> str:
    s = summary
    now_ms = time.time() * 1000.0
    parts = [table(["room", "idle s", "last seq", "next", "waiting", "backlog ms", "voice", "expires s"],
                   [[s.room, s.idle_s, s.last_seq, s.next_seq, s.waiting, s.backlog_ms, s.voice, s.expires_s]]), ""]
    if s.switch:
        parts[-1:-1] = [f"voice switch: {s.switch}"]

    def status(seq: int) -> str:
        return "played" if seq < s.next_seq else "playing" if seq == s.next_seq else "waiting"

    parts.append(table(["seq", "age s", "status", "sender", "voice", "text"],
                       [[u.get("seq"), (now_ms - float(u.get("time") or now_ms)) / 1000.0,
                         status(int(u.get("seq") or 0)), u.get("sender"), u.get("voice"), u.get("text")]
                        for u in utterances]) if utterances else "no utterances")
    parts.append("")
    parts.append(table(["pending job", "seq", "consumer", "idle ms", "deliveries"],
                       [[p.entry_id, p.seq, p.consumer, p.idle_ms, p.deliveries] for p in pending])
                 if pending else "no pending job for this room")
    parts.append("")
    parts.append(table(["output entry", "kind", "seq", "chunk", "bytes", "status"],
                       [[o.get("id"), o.get("kind"), o.get("seq"), o.get("chunk", ""), o.get("frame_bytes", ""),
                         o.get("status", "")] for o in output]) if output else "no output entries")
    return "\n".join(parts)


# -- commands --------------------------------------------------------------------------------------


DEFAULT_URL = "redis://127.0.0.1:6379/0"


def _url(settings: Settings, *, say: bool = False) -> str:
    """``REDIS_URL``; unset, the Redis of a ``voxroom serve`` running here (said on stderr when
    ``say``), else the default (voxroom/serve_discovery.py)."""
    if settings.redis_url:
        return settings.redis_url
    from voxroom.serve_discovery import running_serve

    found = running_serve()
    if found is None:
        return DEFAULT_URL
    pid, url = found
    if say:
        print(f"voxroom: REDIS_URL is not set: reading the Redis of voxroom serve (pid {pid}) at "
              f"{_without_secrets(url)}", file=sys.stderr)
    return url


def _redis(settings: Settings) -> Client:
    """A cluster client when ``REDIS_URL`` names a cluster node (``INFO cluster``): it discovers
    the other nodes and routes each read to the node of its key."""
    from voxroom.redis_client import cluster_enabled

    url = _url(settings, say=True)
    if cluster_enabled(url):
        return RedisCluster.from_url(url, socket_timeout=5)
    return Redis.from_url(url, socket_timeout=5)


def _without_secrets(url: str) -> str:
    """``url`` as an operator may see it in a terminal: no user, no password, no query."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], query=""))


@contextlib.contextmanager
def _answering(settings: Settings) -> Iterator[None]:
    """An inspection is one look, not a service: a Redis that cannot answer (down, loading, a
    wrong password) is one line on stderr and exit status 2 (``voxroom.cli.main``), not a
    traceback."""
    try:
        yield
    except REDIS_DOWN as exc:
        where = _without_secrets(_url(settings))
        raise VoxroomError(f"Redis at {where} cannot answer: {exc}") from None


def cmd_rooms(settings: Settings, args: argparse.Namespace) -> int:
    with _answering(settings), _redis(settings) as r:
        shards = settings.job_shards
        print(render_rooms(list_rooms(r, args.limit, idle_ttl_s=settings.room_idle_ttl_s, shards=shards),
                           job_groups(r, shards=shards), workers(r)))
    return 0


def cmd_room(settings: Settings, args: argparse.Namespace) -> int:
    if not valid_room_id(args.room_id):
        # The gateway never makes such a room, so Redis cannot hold one: say so rather than
        # "nothing in Redis", which would send the operator looking for a room that never was.
        raise VoxroomError(f"not a room id: {args.room_id!r} (1 to 64 of A-Z a-z 0-9 _ -, as the gateway takes)")
    with _answering(settings), _redis(settings) as r:
        shards = settings.job_shards
        (summary,) = room_summaries(r, [args.room_id], shards=shards)
        if summary.gone:
            print(f"room {args.room_id!r} has nothing in Redis")
            return 1
        print(render_room(summary, recent_utterances(r, args.room_id, args.utterances),
                          pending_jobs(r, args.room_id, shards=shards), output_tail(r, args.room_id, args.output)))
    return 0


def add_commands(sub: Any, common: Callable[[argparse.ArgumentParser], None],
                 settings_of: Callable[[argparse.Namespace], Settings]) -> None:
    """Register ``rooms`` and ``room`` on the CLI's subparsers."""
    rooms = sub.add_parser("rooms", help="recently active rooms, the job queue and live workers")
    common(rooms)
    rooms.add_argument("--limit", type=int, default=50, help="rooms to show, newest first (default 50)")
    rooms.set_defaults(func=lambda a: cmd_rooms(settings_of(a), a))
    room = sub.add_parser("room", help="one room: state, recent utterances, pending jobs, output tail")
    common(room)
    room.add_argument("room_id")
    room.add_argument("--utterances", type=int, default=10, help="recent utterances to show (default 10)")
    room.add_argument("--output", type=int, default=10, help="output entries to show (default 10)")
    room.set_defaults(func=lambda a: cmd_room(settings_of(a), a))
