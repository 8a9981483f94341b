"""Room fan-out: one blocked ``XREAD`` over many rooms, each entry copied to the room's clients.

A gateway serves any room, whichever worker synthesized it: it reads each room's output stream
(``vx:room:{room}:out``) from the moment its first local client joined. Rooms are spread over
readers of at most ``rooms_per_reader`` rooms; each reader holds one blocked ``XREAD`` (one Redis
connection) over all its rooms plus a private *wake* stream, so that a room joining or leaving
interrupts the read at once instead of waiting for a timeout.

Audio entries carry the client's binary frame ready-made, so the hot path is: read, look up the
room's clients, append the same ``bytes`` object to each client's bounded queue.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from app.connection import ClientConnection
from voxroom import keys, metrics
from voxroom.autopipe import AutoPipeline
from voxroom.backoff import REDIS_DOWN, Backoff
from voxroom.protocol import CODEC_OPUS, ROOM_RATE

log = logging.getLogger("voxroom.gateway.hub")

WAKE_MAXLEN = 16
REPLAY_BATCH = 256
READ_BLOCK_MS = 2000
OPUS_DEMAND_TTL_S = 30
READ_COUNT = 512


def control_message(fields: dict[bytes, bytes]) -> str | None:
    """The client's JSON for a ``start`` or ``end`` entry of a room's output stream."""
    kind = fields.get(b"kind")
    if kind == b"start":
        msg: dict[str, Any] = {
            "type": "start", "utterance": int(fields[b"seq"]), "sender": fields.get(b"sender", b"").decode(),
            "voice": fields.get(b"voice", b"").decode(), "text": fields.get(b"text", b"").decode(),
            "pts_ms": float(fields.get(b"pts_ms", b"0")), "sample_rate": int(fields.get(b"rate", ROOM_RATE)),
        }
        if fields.get(b"restart"):
            msg["restart"] = True
    elif kind == b"end":
        msg = {"type": "end", "utterance": int(fields[b"seq"]), "chunks": int(fields.get(b"chunks", b"0")),
               "duration_ms": float(fields.get(b"duration_ms", b"0")),
               "status": fields.get(b"status", b"ok").decode()}
        if b"error" in fields:
            msg["error"] = fields[b"error"].decode()
    else:
        return None
    return json.dumps(msg, ensure_ascii=False, separators=(",", ":"))


class _Reader:
    def __init__(self, hub: RoomHub, index: int) -> None:
        self.hub = hub
        self.index = index
        self.wake_key = keys.gateway_wake(hub.gateway_id, index)
        self.cursors: dict[str, str] = {}
        self.task: asyncio.Task[None] | None = None
        self.wire = AutoPipeline(hub.redis, timeout_s=READ_BLOCK_MS / 1000 + 5)
        """This reader's own connection: a blocked read must not hold up anybody's commands."""

    async def wake(self) -> None:
        # On the hub's shared pipelined connection: a hundred clients leaving at once are a
        # hundred wakes, which must not each take a pooled connection.
        await self.hub.control.group([  # raises an error reply, as a redis-py pipeline would
            ("XADD", self.wake_key, "MAXLEN", WAKE_MAXLEN, "*", "w", 1), ("EXPIRE", self.wake_key, 3600)])

    async def run(self) -> None:
        backoff = Backoff()
        wake_cursor: str | None = None
        while True:
            try:
                if wake_cursor is None:
                    # An explicit id, not "$": a wake written between building the stream list and
                    # the XREAD reaching Redis must still be returned, or a joining room waits a
                    # whole block for its first read.
                    wake_cursor = await _tail(self.hub.control, self.wake_key)
                rooms = list(self.cursors.items())
                # On its own pipelined connection (voxroom/autopipe.py): a 200-room XREAD packed
                # by hiredis costs a tenth of redis-py's packing, and this read runs once per
                # burst of entries, hundreds of times a second when many rooms speak.
                resp: Any = await self.wire.call(
                    "XREAD", "COUNT", READ_COUNT, "BLOCK", READ_BLOCK_MS, "STREAMS",
                    *[keys.room_output(r) for r, _ in rooms], self.wake_key,
                    *[c for _, c in rooms], wake_cursor)
                backoff.reset()
            except REDIS_DOWN as exc:
                log.warning("hub reader %d: redis unavailable (%s); retrying in %.1f s", self.index, exc,
                            backoff.delay)
                await backoff.wait()
                continue
            for stream, entries in resp or []:
                name = stream.decode() if isinstance(stream, bytes) else stream
                last = entries[-1][0]
                last = last.decode() if isinstance(last, bytes) else last
                if name == self.wake_key:
                    wake_cursor = last
                    continue
                room = name[len(keys.PREFIX) + len(":room:"):-len(":out")]
                if room in self.cursors:
                    self.cursors[room] = last
                    self.hub.dispatch(room, [(entry_id, _fields(flat)) for entry_id, flat in entries])


def _fields(flat: list[Any] | None) -> dict[Any, Any]:
    """A stream entry's ``[field, value, field, value...]`` as a dict (RESP2, as read raw)."""
    return dict(zip(flat[::2], flat[1::2], strict=True)) if flat else {}


async def _tail(control: AutoPipeline, key: str) -> str:
    """The id of the stream's last entry (``0-0`` when it has none)."""
    last = await control.call("XREVRANGE", key, "+", "-", "COUNT", 1)
    if not last:
        return "0-0"
    entry_id = last[0][0]
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


class RoomHub:
    """Which local clients are in which room, and the readers that feed them.

    ``redis`` must be a client with ``decode_responses=False``: frames are bytes.
    """

    def __init__(self, redis: Redis, gateway_id: str, *, rooms_per_reader: int = 200,
                 on_frame: Callable[[int], None] | None = None) -> None:
        self.redis = redis
        self.gateway_id = gateway_id
        self.rooms_per_reader = rooms_per_reader
        self.control = AutoPipeline(redis)
        """Joins' and leaves' small commands, pipelined on one connection."""
        self.rooms: dict[str, set[ClientConnection]] = {}
        self._reader_of: dict[str, _Reader] = {}
        self._readers: list[_Reader] = []
        self._lock = asyncio.Lock()
        self._on_frame = on_frame
        self.frames_in = 0

    async def join(self, client: ClientConnection) -> None:
        """Add a client; from now on it gets every entry after ``client.joined_at``."""
        if client.codec == CODEC_OPUS:
            await self._want_opus([client.room])
        async with self._lock:
            members = self.rooms.get(client.room)
            if members is not None:
                members.add(client)
                # The reader dispatches synchronously right after moving its cursor, so entries up
                # to the cursor went to the others and everything after it reaches this client too.
                client.joined_at = self._reader_of[client.room].cursors[client.room]
                return
            # Start from the stream's current tail: nothing published after this join is missed.
            # Read before the room is registered, so that a failed read (Redis down) leaves no
            # half-joined room behind (the endpoint's leave would find no reader for it).
            tail = await _tail(self.control, keys.room_output(client.room))
            reader = self._pick_reader()
            self.rooms[client.room] = {client}
            reader.cursors[client.room] = client.joined_at = tail
            self._reader_of[client.room] = reader
        await reader.wake()

    async def replay(self, client: ClientConnection, seq: int, chunk: int) -> int:
        """Resume: queue for ``client`` what the room published after (utterance ``seq``, slice
        ``chunk``) and before the client joined, ahead of the live entries. The scan is bounded by
        the output stream's MAXLEN; what was trimmed away is gone (the client sees the gap as
        missing chunks). Returns how many entries were queued."""
        key = keys.room_output(client.room)
        upper = client.joined_at or "+"
        found: list[Any] = []
        done = False
        while not done:
            batch: Any = await self.redis.xrevrange(key, max=upper, min="-", count=REPLAY_BATCH)
            if not batch:
                break
            for entry_id, fields in batch:
                entry_seq = int(fields.get(b"seq", b"0"))
                kind = fields.get(b"kind")
                entry_chunk = int(fields.get(b"chunk", b"-1")) if kind == b"chunk" else -1
                if entry_seq < seq or (entry_seq == seq and (kind == b"start" or entry_chunk == chunk)):
                    done = True
                    break
                if entry_seq > seq or entry_chunk > chunk or kind == b"end":
                    found.append((entry_id, fields))
            if len(batch) < REPLAY_BATCH:
                break
            last = batch[-1][0]
            upper = "(" + (last.decode() if isinstance(last, bytes) else str(last))
        found.reverse()
        items: list[str | bytes] = []
        for _entry_id, fields in found:
            frame = fields.get(b"frame")
            if frame is not None:
                opus = fields.get(b"opus")
                items.append(opus if opus is not None and client.codec == CODEC_OPUS else frame)
                continue
            text = control_message(fields)
            if text is not None:
                items.append(text)
        client.prepend(items)
        return len(items)

    async def leave(self, client: ClientConnection) -> None:
        async with self._lock:
            members = self.rooms.get(client.room)
            if members is None:
                return
            members.discard(client)
            if members:
                return
            del self.rooms[client.room]
            reader = self._reader_of.pop(client.room)
            reader.cursors.pop(client.room, None)
        try:
            await reader.wake()
        except (RedisConnectionError, RedisTimeoutError, OSError):
            pass  # the reader drops the room on its next read anyway

    async def _want_opus(self, rooms: list[str]) -> None:
        pipe = self.redis.pipeline(transaction=False)
        for room in rooms:
            pipe.set(keys.room_opus_demand(room), 1, ex=OPUS_DEMAND_TTL_S)
        await pipe.execute()

    async def keep_opus_demand(self) -> None:
        """Refresh the Opus demand of rooms with Opus clients here, so workers keep encoding it;
        when the last one leaves (or this gateway dies) the key simply expires."""
        while True:
            await asyncio.sleep(OPUS_DEMAND_TTL_S / 3)
            rooms = [room for room, members in self.rooms.items() if any(c.codec == CODEC_OPUS for c in members)]
            if rooms:
                try:
                    await self._want_opus(rooms)
                except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                    log.warning("could not refresh opus demand: %s", exc)

    def _pick_reader(self) -> _Reader:
        for reader in self._readers:
            if len(reader.cursors) < self.rooms_per_reader:
                return reader
        reader = _Reader(self, len(self._readers))
        reader.task = asyncio.create_task(reader.run(), name=f"hub:reader:{reader.index}")
        reader.task.add_done_callback(_surface)
        self._readers.append(reader)
        return reader

    def dispatch(self, room: str, entries: list[Any]) -> None:
        members = self.rooms.get(room)
        if not members:
            return
        for _entry_id, fields in entries:
            frame = fields.get(b"frame")
            if frame is not None:
                self.frames_in += 1
                # Workers encode Opus once per room; a chunk without it (PyAV missing there, or
                # VOXROOM_OPUS_BITRATE=0) reaches Opus clients as PCM: the codec byte says which.
                opus = fields.get(b"opus")
                for client in members:
                    client.send_audio(opus if opus is not None and client.codec == CODEC_OPUS else frame)
                continue
            text = control_message(fields)
            if fields.get(b"kind") == b"start":  # travels with the utterance's first slice
                metrics.FIRST_AUDIO.started(room, int(fields[b"seq"]))
            if text is not None:
                for client in members:
                    client.send_text(text)

    async def close(self) -> None:
        for reader in self._readers:
            if reader.task is not None:
                reader.task.cancel()
        await asyncio.gather(*(r.task for r in self._readers if r.task), return_exceptions=True)
        for reader in self._readers:
            await reader.wire.aclose()
        await self.control.aclose()
        if self._readers:
            try:
                await self.redis.delete(*(r.wake_key for r in self._readers))
            except (RedisConnectionError, RedisTimeoutError, OSError):
                pass


def _surface(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s failed", task.get_name(), exc_info=task.exception())
