"""Room fan-out: each room's output entries copied to the room's clients on this gateway.

A gateway serves any room, whichever worker synthesized it: it reads each room's output stream
(``vx:room:{room}:out``) from the moment its first local client joined. How the rooms are read is
the store's fan-out source (``voxroom.store.interface.FanoutSource``): on one Redis, readers of
at most ``rooms_per_reader`` rooms with one blocked ``XREAD`` each and a wake stream
(voxroom/store/single/fanout.py); on a Redis Cluster, each room read when its bell rings
(voxroom/store/cluster/fanout.py). Either delivers each room's entries once, in order, with the
room's cursor moved first; their loops run under the gateway's supervisor (``/readyz``).

Audio entries carry the client's binary frame ready-made, so the hot path is: read, look up the
room's clients, append the same ``bytes`` object to each client's bounded queue. The entries of a
private line (``say`` with ``to``) name their audience: they go to those clients only, here and in
a catch-up alike (``app/fanout/entries.py``).

A room's clients are *live* (fed by the source) or *catching up* (a resuming client fed from Redis
by ``app/fanout/catchup.py`` until its position reaches the source's cursor; then it turns live in
the same loop turn, so nothing is missed or sent twice).

Joins need no lock: a room's first join reads the stream's tail (joins issued together share one
pipelined round trip), later joins of the same room wait for it, and the room is registered only
once the read succeeded (a failed join leaves no half-joined room).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from app.fanout import catchup
from app.fanout.connection import ClientConnection
from app.fanout.cutoff import CutOff
from app.fanout.entries import control, fields
from app.fanout.resume import ResumePoint, held_slices, stop_here
from voxroom.runtime import metrics
from voxroom.runtime.supervisor import Supervisor
from voxroom.store import entry_ids, keys
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.interface import Commands, Store
from voxroom.wire.output_entries import audience, slice_frames
from voxroom.wire.protocol import CODEC_OPUS, encode_server_message

log = logging.getLogger("voxroom.gateway.hub")

OPUS_DEMAND_TTL_S = 30


class ResumeRefused(Exception):
    """A ``resume`` message that cannot be honoured without reordering what the client got."""


class RoomHub:
    """Which local clients are in which room, and the store's fan-out source that feeds them."""

    def __init__(self, store: Store, gateway_id: str, *, rooms_per_reader: int = 200,
                 on_frame: Callable[[int], None] | None = None, supervisor: Supervisor | None = None) -> None:
        self.gateway_id = gateway_id
        self.supervisor = supervisor or Supervisor("gateway")
        self.control: Commands = store.commands(decode=False)
        """Joins', leaves' and catch-ups' commands (bytes replies: entries carry audio), pipelined
        on one connection (one per node on a cluster)."""
        self.cutoff = CutOff()
        """Whether this gateway can read Redis at all (a partition): logged, counted, told /readyz."""
        self.source = store.fanout(self.control, self.supervisor, gateway_id, self, rooms_per_reader=rooms_per_reader)
        self.rooms: dict[str, set[ClientConnection]] = {}
        """Room -> its live clients (may be empty while all its clients are catching up)."""
        self.catching: dict[str, set[ClientConnection]] = {}
        self._catchups: dict[ClientConnection, asyncio.Task[None]] = {}
        self._joining: dict[str, asyncio.Future[None]] = {}
        self._advanced = asyncio.Event()
        self._on_frame = on_frame
        self.frames_in = 0
        self._closed = False

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
        while room not in self.rooms:
            pending = self._joining.get(room)
            if pending is not None:  # another client is reading this room's tail: wait for it
                await asyncio.wait([pending])
                continue
            self._joining[room] = asyncio.get_running_loop().create_future()
            try:
                # Read before the room is registered, so that a failed read (Redis down) leaves no
                # half-joined room behind.
                tail = await entry_ids.tail(self.control, keys.room_output(room))
                self.rooms[room] = set()
                self.catching[room] = set()
                await self.source.add(room, tail)
            finally:
                self._joining.pop(room).set_result(None)
        self._add(client, resume, welcome)

    def _add(self, client: ClientConnection, resume: ResumePoint | None, welcome: str | None) -> None:
        room = client.room
        if welcome is not None:
            client.send_text(welcome)
        if resume is None:
            self.rooms[room].add(client)
            # The source delivers synchronously right after moving its cursor, so entries up
            # to the cursor went to the others and everything after it reaches this client too.
            client.joined_at = self.source.cursor(room)
            return
        self.catching[room].add(client)
        self._start_catchup(client, resume)

    def _start_catchup(self, client: ClientConnection, resume: ResumePoint | None, *, at: str | None = None) -> None:
        task = asyncio.create_task(catchup.catch_up(self, client, resume, at=at),
                                   name=f"room:{client.room}:client:{client.client_id}:catchup")
        self._catchups[client] = task
        task.add_done_callback(lambda t: self._catchup_done(client, t))

    def _catchup_done(self, client: ClientConnection, task: asyncio.Task[None]) -> None:
        if self._catchups.get(client) is task:
            del self._catchups[client]
        _surface(task)

    def cursor(self, room: str) -> str | None:
        """The room's cursor: every entry up to it was dispatched to the live clients."""
        return self.source.cursor(room) if room in self.rooms else None

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
        try:
            await self.source.remove(room)
        except Exception as exc:  # never raises, as above; the source drops the room anyway
            log.debug("could not remove room %s from the fan-out: %s", room, exc)

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

    # -- what the fan-out source tells the hub (voxroom.store.interface.FanoutEvents) -------------

    def deliver(self, room: str, entries: list[Any]) -> None:
        self.dispatch(room, [(entry_id, fields(flat)) for entry_id, flat in entries])

    def resync(self, room: str, cursor: str) -> None:
        """The room's reads come back after a cut-off: what follows ``cursor`` waited in Redis.
        Pushed into each live client's bounded queue at once, the oldest audio would be dropped
        (16 lines cut to their tails in the partition test); instead each live client becomes a
        catching-up one from ``cursor``, fed from Redis at the pace it drains, then live again,
        exactly as a client resuming with ``?resume=`` (app/fanout/catchup.py)."""
        live = self.rooms.get(room)
        if not live:
            return
        self.catching[room] |= live
        for client in live:
            self._start_catchup(client, None, at=cursor)
        self.cutoff.resynced += len(live)
        live.clear()

    def unreachable(self, error: BaseException) -> None:
        self.cutoff.failed(error)

    def reachable(self) -> None:
        self.cutoff.succeeded()

    def dispatch(self, room: str, entries: list[Any]) -> None:
        everyone = self.rooms.get(room)
        if not everyone:
            return
        for _entry_id, entry in entries:
            members: set[ClientConnection] | list[ClientConnection] = everyone
            if b"to" in entry:  # a private line's: its audience only (voxroom/wire/output_entries.py)
                allowed = audience(entry) or frozenset()
                members = [client for client in everyone if client.client_id in allowed]
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
        """Stop the catch-ups and the reads; :attr:`control` stays open for whatever else the
        gateway closes with it (:meth:`aclose` closes it last). Idempotent."""
        if self._closed:
            return
        self._closed = True
        for task in list(self._catchups.values()):
            task.cancel()
        await asyncio.gather(*self._catchups.values(), return_exceptions=True)
        await self.source.aclose()

    async def aclose(self) -> None:
        """:meth:`close`, then :attr:`control` (after everything else that used it)."""
        await self.close()
        await self.control.aclose()


def _surface(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("task %s failed", task.get_name(), exc_info=task.exception())
