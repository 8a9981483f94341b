"""``voxroom rooms`` and ``voxroom room ID``: what a room holds in Redis, as readable tables.

The same reads as the ``redis-cli`` recipes in docs/operations.md (``ZREVRANGE vx:rooms``,
``HGETALL vx:room:{id}:state``, ``XREVRANGE vx:room:{id}:utt``, ``XPENDING vx:jobs workers``,
``XINFO GROUPS vx:jobs``), so an operator can check one against the other. Read-only: nothing here
writes to Redis.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from redis import Redis
from redis.exceptions import ResponseError

from voxroom import keys
from voxroom.settings import Settings

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


def room_summaries(r: Redis, room_ids: Sequence[str], now_ms: float | None = None) -> list[RoomSummary]:
    now = time.time() * 1000.0 if now_ms is None else now_ms
    pipe = r.pipeline(transaction=False)
    for room in room_ids:
        pipe.zscore(keys.ROOMS, room)
        pipe.get(keys.room_seq(room))
        pipe.hgetall(keys.room_state(room))
        pipe.xlen(keys.room_utterances(room))
        pipe.xlen(keys.room_output(room))
    replies: list[Any] = pipe.execute()
    out = []
    for i, room in enumerate(room_ids):
        score, seq, state, n_utt, n_out = replies[5 * i:5 * i + 5]
        st = _fields(state or {})
        end_ms = float(st.get("end_ms") or 0.0)
        out.append(RoomSummary(
            room=room, idle_s=(now - float(score)) / 1000.0 if score is not None else float("nan"),
            last_seq=int(seq or 0), next_seq=int(st.get("next") or 1), voice=st.get("voice", ""),
            utterances=int(n_utt), output_entries=int(n_out), backlog_ms=max(0.0, end_ms - now)))
    return out


def list_rooms(r: Redis, limit: int = 50) -> list[RoomSummary]:
    """The ``limit`` most recently active rooms, newest first."""
    ids = [_s(x) for x in r.zrevrange(keys.ROOMS, 0, max(0, limit - 1))]
    return room_summaries(r, ids)


def recent_utterances(r: Redis, room: str, count: int = 10) -> list[dict[str, str]]:
    """The room's last ``count`` utterances, newest first (fields as the ``say`` script wrote them)."""
    entries: Any = r.xrevrange(keys.room_utterances(room), count=count)
    return [dict(_fields(f or {}), id=_s(i)) for i, f in entries]


def output_tail(r: Redis, room: str, count: int = 10) -> list[dict[str, str]]:
    """The room's last output entries without their audio bytes (``frame`` is binary)."""
    rows = []
    entries: Any = r.xrevrange(keys.room_output(room), count=count)
    for entry_id, raw in entries:
        fields = {_s(k): v for k, v in raw.items()}
        frame = fields.pop("frame", None)
        row = {k: _s(v) for k, v in fields.items()}
        row["id"] = _s(entry_id)
        if frame is not None:
            row["frame_bytes"] = str(len(frame))
        rows.append(row)
    return rows


def pending_jobs(r: Redis, room: str | None = None, scan: int = PENDING_SCAN) -> list[PendingJob]:
    """Jobs read by a worker and not acked (``XPENDING``), optionally only ``room``'s."""
    try:
        pending: Any = r.xpending_range(keys.JOBS, keys.JOBS_GROUP, min="-", max="+", count=scan)
    except ResponseError as exc:  # NOGROUP before the first worker ever started
        if "NOGROUP" in str(exc) or "no such key" in str(exc):
            return []
        raise
    pipe = r.pipeline(transaction=False)
    for p in pending:
        entry_id = _s(p["message_id"])
        pipe.xrange(keys.JOBS, min=entry_id, max=entry_id)
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


def job_groups(r: Redis) -> list[dict[str, str]]:
    """``XINFO GROUPS vx:jobs``: per consumer group, pending and lag (lag is Redis 7 only)."""
    try:
        return [_fields(g) for g in r.xinfo_groups(keys.JOBS)]
    except ResponseError as exc:
        if "no such key" in str(exc):
            return []
        raise


def workers(r: Redis) -> dict[str, dict[str, str]]:
    out = {}
    for key in r.scan_iter(match=keys.worker_pattern(), count=100):
        name = _s(key)
        out[name.rsplit(":", 1)[-1]] = _fields(r.hgetall(name))
    return out


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
        return "-" if value != value else f"{value:.1f}"  # NaN: never active
    text = str(value)
    return text if len(text) <= 48 else text[:45] + "..."


def render_rooms(rooms: Sequence[RoomSummary], groups: Sequence[dict[str, str]],
                 live_workers: dict[str, dict[str, str]]) -> str:
    parts = [table(["room", "idle s", "last seq", "next", "waiting", "backlog ms", "voice", "utt log", "out"],
                   [[s.room, s.idle_s, s.last_seq, s.next_seq, s.waiting, s.backlog_ms, s.voice, s.utterances,
                     s.output_entries] for s in rooms]) if rooms else "no rooms"]
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
    parts = [table(["room", "idle s", "last seq", "next", "waiting", "backlog ms", "voice"],
                   [[s.room, s.idle_s, s.last_seq, s.next_seq, s.waiting, s.backlog_ms, s.voice]]), ""]

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


def _redis(settings: Settings) -> Redis:
    return Redis.from_url(settings.redis_url or "redis://127.0.0.1:6379/0", socket_timeout=5)


def cmd_rooms(settings: Settings, args: argparse.Namespace) -> int:
    with _redis(settings) as r:
        print(render_rooms(list_rooms(r, args.limit), job_groups(r), workers(r)))
    return 0


def cmd_room(settings: Settings, args: argparse.Namespace) -> int:
    with _redis(settings) as r:
        (summary,) = room_summaries(r, [args.room_id])
        if summary.last_seq == 0 and summary.utterances == 0 and summary.output_entries == 0:
            print(f"room {args.room_id!r} has nothing in Redis")
            return 1
        print(render_room(summary, recent_utterances(r, args.room_id, args.utterances),
                          pending_jobs(r, args.room_id), output_tail(r, args.room_id, args.output)))
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
