"""Room fan-out: one blocked ``XREAD`` over many rooms, each entry copied to the room's clients.

A gateway serves any room, whichever worker synthesized it: it reads each room's output stream
(``vx:room:{room}:out``) from the moment its first local client joined. Rooms are spread over
readers of at most ``rooms_per_reader`` rooms; each reader holds one blocked ``XREAD`` (one Redis
connection) over all its rooms plus a private *wake* stream, so that a room joining or leaving
interrupts the read at once instead of waiting for a timeout. Readers run under the gateway's
:class:`~voxroom.runtime.supervisor.Supervisor`: one that fails is restarted (and reported by ``/readyz``
while down); an unavailable Redis (down, loading, out of memory) is waited out with backoff.

Audio entries carry the client's binary frame ready-made, so the hot path is: read, look up the
room's clients, append the same ``bytes`` object to each client's bounded queue.

A room's clients are *live* (fed by the reader) or *catching up* (a resuming client fed from Redis
by ``app/fanout/catchup.py`` until its position reaches the reader's cursor; then it turns live in the
same loop turn, so nothing is missed or sent twice).

Joins need no lock: a room's first join reads the stream's tail (joins issued together share one
pipelined round trip), later joins of the same room wait for that read, and the room is registered
only once the read succeeded (a failed join leaves no half-joined room).

**On a Redis Cluster** (``redis`` a ``RedisCluster``, decided once when the gateway starts) one
``XREAD`` cannot span rooms: their keys lie in different slots and a cluster refuses that
(``CROSSSLOT``, even on one node). So nothing blocks there: the workers ring each room's sharded
pub/sub bell after writing to its ``:out``, the gateway holds one subscriber connection per
primary (``voxroom/store/cluster/bells.py``), and a bell makes a non-blocking ``XREAD`` of that room
on the node's autopipeline (``voxroom/store/cluster/pipeline.py``), coalesced per room, with a read of
every room every ``READ_BLOCK_MS`` besides (``voxroom/store/cluster/fanout.py``). Connections per
gateway: two per primary, whatever the number of rooms. One reader object holds every room's
cursor, no wake stream; everything else here (cursors, catch-up, dispatch) is the same.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from app.fanout import catchup
from app.fanout.entries import control, entry_id_str, fields
from app.fanout.resume import ResumePoint, held_slices, stop_here
from app.room.connection import ClientConnection
from voxroom.runtime import metrics
from voxroom.runtime.supervisor import Supervisor
from voxroom.store import keys
from voxroom.store.autopipe import AutoPipeline, Commands
from voxroom.store.backoff import REDIS_DOWN, Backoff
from voxroom.store.cluster.fanout import ClusterFanout
from voxroom.store.cluster.pipeline import ClusterAutoPipeline
from voxroom.store.cluster.slots import ClusterReads
from voxroom.wire.output_entries import slice_frames
from voxroom.wire.protocol import CODEC_OPUS, encode_server_message

log = logging.getLogger("voxroom.gateway.hub")

WAKE_MAXLEN = 16
READ_BLOCK_MS = 2000
OPUS_DEMAND_TTL_S = 30
READ_COUNT = 512


class ResumeRefused(Exception):
    """A ``resume`` message that cannot be honoured without reordering what the client got."""


class _Reader:
    def __init__(self, hub: RoomHub, index: int) -> None:
        self.hub = hub
        self.index = index
        self.name = f"hub:reader:{index}"
        self.wake_key = keys.gateway_wake(hub.gateway_id, index)
        self.cursors: dict[str, str] = {}
        """Room -> id of the last entry read and dispatched (or the tail when the room joined)."""
        self.task: asyncio.Task[None] | None = None
        self.wire = (AutoPipeline(hub.client, timeout_s=READ_BLOCK_MS / 1000 + 5)
                     if isinstance(hub.client, Redis) else None)
        """This reader's own connection: a blocked read must not hold up anybody's commands."""

    async def wake(self) -> None:
        # On the hub's shared pipelined connection: a hundred clients leaving at once are a
        # hundred wakes, which must not each take a pooled connection.
        await self.hub.control.group([  # raises an error reply, as a redis-py pipeline would
            ("XADD", self.wake_key, "MAXLEN", WAKE_MAXLEN, "*", "w", 1), ("EXPIRE", self.wake_key, 3600)])

    async def run(self) -> None:
        """Read and dispatch until cancelled. Redis being unavailable is waited out here; anything
        else raises to the supervisor, which restarts this (the cursors are kept)."""
        assert self.wire is not None
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
                # On its own pipelined connection (voxroom/store/autopipe.py): a 200-room XREAD packed
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
                if name == self.wake_key:
                    wake_cursor = entry_id_str(entries[-1][0])
                    continue
                self._dispatch(name, entries)
            self.hub.pulse()

    def _dispatch(self, name: str, entries: list[Any]) -> None:
        room = keys.room_of_key(name)
        if room in self.cursors:
            # Cursor moved and entries dispatched with no await in between: a catching-up
            # client that compares its position with the cursor sees a consistent pair.
            self.cursors[room] = entry_id_str(entries[-1][0])
            self.hub.dispatch(room, [(entry_id, fields(flat)) for entry_id, flat in entries])


async def _tail(control: Commands, key: str) -> str:
    """The id of the stream's last entry (``0-0`` when it has none)."""
    last = await control.call("XREVRANGE", key, "+", "-", "COUNT", 1)
    return entry_id_str(last[0][0]) if last else "0-0"


class RoomHub:
    """Which local clients are in which room, and the readers that feed them.

    ``redis`` must be a client with ``decode_responses=False``: frames are bytes.
    """

    def __init__(self, redis: Redis | RedisCluster, gateway_id: str, *, rooms_per_reader: int = 200,
                 on_frame: Callable[[int], None] | None = None, supervisor: Supervisor | None = None) -> None:
        self.client = redis
        self.gateway_id = gateway_id
        self.rooms_per_reader = rooms_per_reader
        self.supervisor = supervisor or Supervisor("gateway")
        self.cluster = ClusterReads(redis) if isinstance(redis, RedisCluster) else None
        """Set on a Redis Cluster: rooms read when their bell rings (see the module's docstring)."""
        self.control: Commands = (AutoPipeline(redis) if isinstance(redis, Redis) else
                                  ClusterAutoPipeline(redis, reads=self.cluster))
        """Joins', leaves' and catch-ups' commands, pipelined on one connection (one per node);
        on a cluster the rooms' reads too."""
        self._cluster_reader: _Reader | None = None
        """On a cluster, the one holder of every room's cursor (it runs no loop of its own)."""
        self.fanout: ClusterFanout | None = None
        if isinstance(redis, RedisCluster) and self.cluster is not None:
            self._cluster_reader = reader = _Reader(self, 0)
            self.fanout = ClusterFanout(redis, self.cluster, self.control, self.supervisor, cursors=reader.cursors,
                                        deliver=reader._dispatch, pulse=self.pulse, count=READ_COUNT,
                                        sweep_s=READ_BLOCK_MS / 1000)
        self.rooms: dict[str, set[ClientConnection]] = {}
        """Room -> its live clients (may be empty while all its clients are catching up)."""
        self.catching: dict[str, set[ClientConnection]] = {}
        self._catchups: dict[ClientConnection, asyncio.Task[None]] = {}
        self._reader_of: dict[str, _Reader] = {}
        self._readers: list[_Reader] = []
        self._joining: dict[str, asyncio.Future[None]] = {}
        self._advanced = asyncio.Event()
        self._on_frame = on_frame
        self.frames_in = 0

    @property
    def redis(self) -> Redis:
        """The single-instance client (the wake stream's cleanup at close, which a cluster's hub
        does not have). Raises ``RuntimeError`` on a cluster: everything else uses ``client``."""
        if not isinstance(self.client, Redis):
            raise RuntimeError("this part of the gateway does not run on Redis Cluster yet (docs/cluster.md)")
        return self.client

    async def join(self, client: ClientConnection, resume: ResumePoint | None = None, *,
                   welcome: str | None = None) -> None:
        """Add a client. Without ``resume`` it gets every entry after ``client.joined_at`` (the
        room's tail now). With ``resume`` it first gets what the room published after that
        point, read from Redis at the pace it drains, then live entries: in order, each once.
        ``welcome`` is queued the moment the client becomes a member, ahead of all of that."""
        if client.codec == CODEC_OPUS:
            try:
                await self._want_opus([client.room])
            except REDIS_DOWN as exc:  # refreshed every 10 s; until then the client gets PCM
                log.warning("could not record opus demand for room %s: %s", client.room, exc)
        room = client.room
        while room not in self._reader_of:
            pending = self._joining.get(room)
            if pending is not None:  # another client is reading this room's tail: wait for it
                await asyncio.wait([pending])
                continue
            self._joining[room] = asyncio.get_running_loop().create_future()
            try:
                # Read before the room is registered, so that a failed read (Redis down) leaves no
                # half-joined room behind.
                tail = await _tail(self.control, keys.room_output(room))
            finally:
                self._joining.pop(room).set_result(None)
            reader = self._pick_reader()
            self.rooms[room] = set()
            self.catching[room] = set()
            reader.cursors[room] = tail
            self._reader_of[room] = reader
            self._add(client, resume, welcome)
            if self.fanout is not None:  # its read follows the bell's subscribe
                self.fanout.add(room)
                return
            try:
                await reader.wake()
            except REDIS_DOWN as exc:  # the reader takes the room at its next read anyway
                log.debug("could not wake hub reader %d: %s", reader.index, exc)
            return
        self._add(client, resume, welcome)

    def _add(self, client: ClientConnection, resume: ResumePoint | None, welcome: str | None) -> None:
        room = client.room
        if welcome is not None:
            client.send_text(welcome)
        if resume is None:
            self.rooms[room].add(client)
            # The reader dispatches synchronously right after moving its cursor, so entries up
            # to the cursor went to the others and everything after it reaches this client too.
            client.joined_at = self._reader_of[room].cursors[room]
            return
        self.catching[room].add(client)
        self._start_catchup(client, resume)

    def _start_catchup(self, client: ClientConnection, resume: ResumePoint) -> None:
        task = asyncio.create_task(catchup.catch_up(self, client, resume),
                                   name=f"room:{client.room}:client:{client.client_id}:catchup")
        self._catchups[client] = task
        task.add_done_callback(lambda t: self._catchup_done(client, t))

    def _catchup_done(self, client: ClientConnection, task: asyncio.Task[None]) -> None:
        if self._catchups.get(client) is task:
            del self._catchups[client]
        _surface(task)

    def cursor(self, room: str) -> str | None:
        """The room reader's cursor: every entry up to it was dispatched to the live clients."""
        reader = self._reader_of.get(room)
        return reader.cursors.get(room) if reader is not None else None

    def go_live(self, client: ClientConnection, at: str) -> bool:
        """Turn a catching-up client live at cursor ``at`` (it holds every entry up to it).
        False when the cursor moved on meanwhile (the caller reads the rest first)."""
        room = client.room
        if self.cursor(room) != at or client not in self.catching.get(room, ()):
            return False
        self.catching[room].discard(client)
        self.rooms[room].add(client)
        client.joined_at = at
        return True

    def pulse(self) -> None:
        """A reader dispatched a batch: wake catch-ups waiting for a cursor to move."""
        event, self._advanced = self._advanced, asyncio.Event()
        event.set()

    async def advanced(self, timeout_s: float) -> None:
        """Wait until some reader dispatches again (or ``timeout_s``)."""
        event = self._advanced
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
        except TimeoutError:
            pass

    async def resume_later(self, client: ClientConnection, point: ResumePoint) -> bool:
        """A ``resume`` message after the welcome. Honoured when it reorders nothing: before any
        room entry was dispatched to this client it becomes a catch-up from ``point`` (True);
        when ``point`` is the very entry the client joined after, nothing was missed (False).
        Otherwise live entries already went out and the missed ones would have to come after
        them: :class:`ResumeRefused` (the client reconnects with ``?resume=`` instead)."""
        room = client.room
        if client in self._catchups or client not in self.rooms.get(room, ()):
            raise ResumeRefused("this connection is already resuming")
        if self.cursor(room) == client.joined_at:
            self.rooms[room].discard(client)
            self.catching[room].add(client)
            self._start_catchup(client, point)
            return True
        joined = client.joined_at or "0-0"
        if joined != "0-0":
            entry: Any = await self.control.call("XRANGE", keys.room_output(room), joined, joined)
            held = fields(entry[0][1]) if entry else {}
            if held and stop_here(point, held) and held_slices(point, held) == int(held.get(b"slices", b"1")):
                return False
        raise ResumeRefused("live audio already went out on this connection: reconnect with ?resume= "
                            "(docs/protocol.md) to get what was missed in order")

    async def leave(self, client: ClientConnection) -> None:
        """Remove a client wherever it is. Never raises: it runs in the endpoint's cleanup, which
        must free the connection's slot whatever Redis is doing."""
        task = self._catchups.pop(client, None)
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        room = client.room
        live, catching = self.rooms.get(room), self.catching.get(room)
        if live is None or catching is None:
            return
        live.discard(client)
        catching.discard(client)
        if live or catching:
            return
        del self.rooms[room], self.catching[room]
        reader = self._reader_of.pop(room)
        reader.cursors.pop(room, None)
        if self.fanout is not None:
            self.fanout.remove(room)
            return
        try:
            await reader.wake()
        except Exception as exc:  # the reader drops the room on its next read anyway
            log.debug("could not wake hub reader %d: %s", reader.index, exc)

    async def _want_opus(self, rooms: list[str]) -> None:
        await self.control.group([("SET", keys.room_opus_demand(room), 1, "EX", OPUS_DEMAND_TTL_S)
                                  for room in rooms])

    async def keep_opus_demand(self) -> None:
        """Refresh the Opus demand of rooms with Opus clients here, so workers keep encoding it;
        when the last one leaves (or this gateway dies) the key simply expires."""
        while True:
            await asyncio.sleep(OPUS_DEMAND_TTL_S / 3)
            rooms = [room for room, members in self.rooms.items()
                     if any(c.codec == CODEC_OPUS for c in (*members, *self.catching.get(room, ())))]
            if rooms:
                try:
                    await self._want_opus(rooms)
                except REDIS_DOWN as exc:
                    log.warning("could not refresh opus demand: %s", exc)

    def _pick_reader(self) -> _Reader:
        if self._cluster_reader is not None:
            return self._cluster_reader
        for reader in self._readers:
            if len(reader.cursors) < self.rooms_per_reader:
                return reader
        reader = _Reader(self, len(self._readers))
        reader.task = self.supervisor.spawn(reader.name, reader.run)
        self._readers.append(reader)
        return reader

    def dispatch(self, room: str, entries: list[Any]) -> None:
        members = self.rooms.get(room)
        if not members:
            return
        for _entry_id, entry in entries:
            frame = entry.get(b"frame")
            if frame is not None:
                # Workers encode Opus once per room; a chunk without it (PyAV missing there, or
                # VOXROOM_OPUS_BITRATE=0) reaches Opus clients as PCM: the codec byte says which.
                if b"slices" not in entry:
                    self.frames_in += 1
                    opus = entry.get(b"opus")
                    for client in members:
                        client.send_audio(opus if opus is not None and client.codec == CODEC_OPUS else frame)
                    continue
                try:  # a group of slices (voxroom/wire/output_entries.py): one frame each, in order
                    pcm = slice_frames(entry)
                    opus_frames = slice_frames(entry, opus=True) if b"opus" in entry else pcm
                except ValueError as exc:
                    log.warning("skipping an output entry of room %s: %s", room, exc)
                    continue
                self.frames_in += len(pcm)
                for client in members:
                    for item in opus_frames if client.codec == CODEC_OPUS else pcm:
                        client.send_audio(item)
                continue
            msg = control(entry)
            if msg is None:
                continue
            if msg["type"] == "start":  # travels with the utterance's first slice
                metrics.FIRST_AUDIO.started(room, msg["utterance"])
            text = encode_server_message(msg)
            for client in members:
                client.send_text(text)

    async def close(self) -> None:
        for task in list(self._catchups.values()):
            task.cancel()
        await asyncio.gather(*self._catchups.values(), return_exceptions=True)
        if self.fanout is not None:
            await self.fanout.aclose()
        for reader in self._readers:
            await self.supervisor.stop(reader.name)
        for reader in self._readers:
            if reader.wire is not None:
                await reader.wire.aclose()
        await self.control.aclose()
        if self._readers and self.cluster is None:
            try:
                await self.redis.delete(*(r.wake_key for r in self._readers))
            except REDIS_DOWN:
                pass


def _surface(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s failed", task.get_name(), exc_info=task.exception())
