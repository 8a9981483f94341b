"""``voxroom rooms`` and ``voxroom room ID``: what a room holds in Redis, as readable tables (the
reads: voxroom/store/inspection.py, the same as docs/operations.md's ``redis-cli`` recipes)."""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from voxroom.errors import VoxroomError
from voxroom.runtime.settings import Settings
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.inspection import PendingJob, RoomInspection, RoomSummary
from voxroom.store.opening import DEFAULT_URL, open_inspection
from voxroom.wire.protocol import valid_room_id

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
        if seq in s.cancelled:
            return "cancelled"
        return "played" if seq < s.next_seq else "playing" if seq == s.next_seq else "waiting"

    parts.append(table(["seq", "age s", "status", "sender", "voice", "text"],
                       [[u.get("seq"), (now_ms - float(u.get("time") or now_ms)) / 1000.0,
                         status(int(u.get("seq") or 0)), u.get("sender"), u.get("voice"), _text(u)]
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


def _text(utterance: dict[str, str]) -> str:
    """A line's text for the table; a private line's is left out: whoever runs this sees that it
    is private and how many it was for, not what it told them (operators who must read it can:
    it is in Redis, docs/security.md)."""
    to = utterance.get("to")
    if to is None:
        return utterance.get("text", "")
    n = len(to.split())
    return f"(private, to {n} client{'s' if n != 1 else ''})"


# -- commands --------------------------------------------------------------------------------------


def _url(settings: Settings, *, say: bool = False) -> str:
    """``REDIS_URL``; unset, the Redis of a ``voxroom serve`` running here (said on stderr when
    ``say``), else the default (voxroom_cli/serve_discovery.py)."""
    if settings.redis_url:
        return settings.redis_url
    from voxroom_cli.serve_discovery import running_serve

    found = running_serve()
    if found is None:
        return DEFAULT_URL
    pid, url = found
    if say:
        print(f"voxroom: REDIS_URL is not set: reading the Redis of voxroom serve (pid {pid}) at "
              f"{_without_secrets(url)}", file=sys.stderr)
    return url


def _inspection(settings: Settings) -> RoomInspection:
    return open_inspection(_url(settings, say=True), job_shards=settings.job_shards)


def _without_secrets(url: str) -> str:
    """``url`` as an operator may see it in a terminal: no user, no password, no query."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2], query=""))


@contextlib.contextmanager
def _answering(settings: Settings) -> Iterator[None]:
    """An inspection is one look, not a service: a Redis that cannot answer (down, loading, a
    wrong password) is one line on stderr and exit status 2 (``voxroom_cli.main.main``), not a
    traceback."""
    try:
        yield
    except REDIS_DOWN as exc:
        where = _without_secrets(_url(settings))
        raise VoxroomError(f"Redis at {where} cannot answer: {exc}") from None


def cmd_rooms(settings: Settings, args: argparse.Namespace) -> int:
    with _answering(settings), _inspection(settings) as r:
        print(render_rooms(r.list_rooms(args.limit, idle_ttl_s=settings.room_idle_ttl_s), r.job_groups(),
                           r.workers()))
    return 0


def cmd_room(settings: Settings, args: argparse.Namespace) -> int:
    if not valid_room_id(args.room_id):
        # The gateway never makes such a room, so Redis cannot hold one: say so rather than
        # "nothing in Redis", which would send the operator looking for a room that never was.
        raise VoxroomError(f"not a room id: {args.room_id!r} (1 to 64 of A-Z a-z 0-9 _ -, as the gateway takes)")
    with _answering(settings), _inspection(settings) as r:
        (summary,) = r.room_summaries([args.room_id])
        if summary.gone:
            print(f"room {args.room_id!r} has nothing in Redis")
            return 1
        print(render_room(summary, r.recent_utterances(args.room_id, args.utterances),
                          r.pending_jobs(args.room_id), r.output_tail(args.room_id, args.output)))
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
