"""Worker tests' view of Redis: put jobs in ``vx:jobs`` as a gateway would, read a room's output
stream as every listener gets it, and judge it (every line ends once, in order, each final take
whole, nothing after an ``end``)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from redis.asyncio import Redis

from voxroom.store import keys


async def add_jobs(r: Redis, lines: list[tuple[str, str]], voice: str = "en-joe") -> None:
    """Enqueue ``(room, text)`` lines in one round trip, numbered per room after what the room
    already has (the fields the gateway's ingress script writes to ``vx:jobs``)."""
    pipe = r.pipeline(transaction=True)
    for room, _text in lines:
        pipe.incr(f"test:seq:{room}")
    seqs = await pipe.execute()
    pipe = r.pipeline(transaction=False)
    now = int(time.time() * 1000)
    for (room, text), seq in zip(lines, seqs, strict=True):
        pipe.xadd(keys.JOBS, {"room": room, "seq": seq, "text": text, "voice": voice, "prev_voice": voice,
                              "sender": "tester", "time": now})
    await pipe.execute()


@dataclass(frozen=True)
class Out:
    """One output entry: ``start``, ``chunk`` or ``end``."""

    entry_id: str
    kind: str
    seq: int
    chunk: int = -1
    restart: bool = False
    chunks: int = -1
    status: str = ""


async def read_out(raw: Redis, room: str) -> list[Out]:
    """The room's output stream, in order, one :class:`Out` per slice as listeners get them
    (``raw`` must not decode: entries carry audio)."""
    entries: Any = await raw.xrange(keys.room_output(room))
    out = []
    for entry_id, fields in entries:
        f = {k.decode(): v for k, v in fields.items()}
        kind = f["kind"].decode()
        # A chunk entry may hold several slices (voxroom/wire/output_entries.py): one Out per slice.
        for i in range(int(f.get("slices", 1)) if kind == "chunk" else 1):
            out.append(Out(entry_id.decode(), kind, int(f["seq"]), chunk=int(f.get("chunk", -1)) + i,
                           restart=b"restart" in fields, chunks=int(f.get("chunks", -1)),
                           status=f.get("status", b"").decode()))
    return out


def problems(entries: list[Out], n: int) -> list[str]:
    """What a listener would hear wrong in a room whose lines 1..n were accepted: an ``end``
    missing, doubled or out of order; anything of a line after its ``end``; a chunk twice or out
    of order within one take; a final take that is not whole. Empty when all is well."""
    found: list[str] = []
    ends = [e.seq for e in entries if e.kind == "end"]
    if ends != list(range(1, n + 1)):
        found.append(f"ends {ends}, expected 1..{n} once each, in order")
    ended: set[int] = set()
    take: dict[int, list[int]] = {}
    for e in entries:
        if e.seq in ended:
            found.append(f"{e.kind} {e.chunk} of line {e.seq} after its end")
            continue
        if e.kind == "start":
            take[e.seq] = []
        elif e.kind == "chunk":
            chunks = take.setdefault(e.seq, [])
            if e.chunk != (chunks[-1] + 1 if chunks else 0):
                found.append(f"line {e.seq}: chunk {e.chunk} after {chunks[-3:]} in one take")
            chunks.append(e.chunk)
        elif e.kind == "end":
            ended.add(e.seq)
            if take.get(e.seq, []) != list(range(e.chunks)):
                found.append(f"line {e.seq}: final take {len(take.get(e.seq, []))} chunks, end says {e.chunks}")
    return found


async def wait_ends(raw: Redis, rooms: dict[str, int], timeout: float) -> dict[str, list[Out]]:
    """Poll until each room has as many ``end`` entries as asked (or the time is up); the rooms'
    output streams."""
    deadline = time.monotonic() + timeout
    while True:
        got = {room: await read_out(raw, room) for room in rooms}
        if all(sum(1 for e in got[room] if e.kind == "end") >= n for room, n in rooms.items()):
            return got
        if time.monotonic() > deadline:
            return got
        await asyncio.sleep(0.1)
