"""Rooms' doorbells on a Redis Cluster: one sharded pub/sub connection per primary says which
rooms' output just grew.

The worker's scripts that append to a room's ``:out`` on a cluster also ``SPUBLISH`` the room's
bell (``vx:room:{room}:bell``, ``keys.room_bell``: the same hash tag, so the same slot and node),
once per script call (voxroom/store/cluster/jobs.py). A gateway holds **one subscriber connection per
primary** that holds some of its rooms (``CLIENT SETNAME vx-gw-bells``), and ``SSUBSCRIBE``s each
room's bell there, one command per room: one command over several slots is refused
(``CROSSSLOT``), several commands on one connection are not (Redis 7.0).

All this module tells its owner is ``ring(room)``: read the room now. It rings

- on every ``smessage`` of a room's bell;
- on every confirmed subscribe (the ``ssubscribe`` reply): a bell rung while the gateway was not
  subscribed is gone, so a read follows every (re)subscribe.

Subscriptions follow the slot map (redis-py's ``RedisCluster`` one, refreshed through
``ClusterReads.refresh``, one ``CLUSTER SLOTS`` for everybody who asks at once):

- a ``sunsubscribe`` the server pushes for a room still wanted: its slot left the node (a
  migration finished, or a failover demoted the node; Redis 7.0 pushes it in both cases, checked
  here). After :data:`MOVED_PAUSE_S` the map is read again (once for all the rooms pushed
  meanwhile) and each room subscribed at its owner.
- ``MOVED`` answering an ``SSUBSCRIBE`` (the map was stale): the same.
- the connection lost or silent (a ``PING`` every :data:`PING_EVERY_S`): backoff (0.1 s doubling
  to 1 s, as the reads had), the map read again, every room of the node subscribed again where
  the map now says (the node itself again while the map still names it: a failover not over).

What this cannot see: a bell rung on a node where the gateway is not subscribed yet. A script
sent to a migrating slot's target after ``ASK`` rings the target, while the gateway still listens
on the source until the migration ends. The hub's sweep (a read of every room every 2 s,
``voxroom/store/cluster/fanout.py``) bounds that to 2 s.

Bounds: one connection and one task per primary holding rooms here; per node the set of its
rooms and its unanswered commands. Needs Redis 7.0 (``SSUBSCRIBE``): an older node is refused
when its connection opens (``RuntimeError``, the loop reported down).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import Connection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import AskError, ResponseError

from voxroom.runtime.supervisor import Supervisor
from voxroom.store import keys
from voxroom.store.backoff import READ_DEADLINE_S, REDIS_DOWN, Backoff
from voxroom.store.cluster.slots import ClusterReads

log = logging.getLogger("voxroom.gateway.bells")

CLIENT_NAME = "vx-gw-bells"
"""What ``CLIENT LIST`` shows for a gateway's subscriber connections."""
PING_EVERY_S = 2.0
"""A connection with nothing to send pings this often; no reply within :data:`REPLY_GRACE_S`
after that: lost (a node gone silent, not closed)."""
REPLY_GRACE_S = READ_DEADLINE_S
MOVED_PAUSE_S = 0.05
"""Before the map is read again for rooms a node no longer serves (``MOVED``, a pushed
``sunsubscribe``): the node asked for it may lag a moment, and the rooms of one migrated slot
gather into one batch."""

_SUBSCRIBE, _UNSUBSCRIBE, _PING = "SSUBSCRIBE", "SUNSUBSCRIBE", "PING"


class _Node:
    """One primary: the rooms whose bells are (to be) subscribed there, and its connection's
    state. Only its own loop reads and writes on the connection."""

    __slots__ = ("connected", "kick", "moved", "name", "outbox", "rooms", "sent")

    def __init__(self, name: str) -> None:
        self.name = name
        self.rooms: set[str] = set()
        self.outbox: list[tuple[str, str]] = []
        """Commands (name, room) to send on the connection, in order."""
        self.sent: deque[tuple[str, str]] = deque()
        """Sent, reply not read yet: replies come back in order, pushes interleaved."""
        self.moved: set[str] = set()
        """Rooms whose slot this node says it no longer serves: placed again in one batch (a
        slot of a hundred rooms migrated is a hundred pushes, and one map refresh)."""
        self.kick = asyncio.Event()
        self.connected = False

    def send(self, command: str, room: str) -> None:
        if self.connected:  # otherwise the next connection subscribes every room anyway
            self.outbox.append((command, room))
        # Kicked either way: a loop whose node's last room left waits on it for the next room to
        # open a connection (once, only a connected node was kicked, and a room joining a node
        # all of whose rooms had left this gateway was never subscribed: heard every 2 s sweep,
        # in bursts that overflowed its listeners' queues).
        self.kick.set()


class ClusterBells:
    """The bells of the rooms :meth:`add`\\ ed, each subscribed on its slot's primary.

    ``ring`` is called synchronously, from the node loops, with the room to read.
    ``cluster`` must be the client of ``reads``. Loops run under ``supervisor`` as
    ``hub:bells:<host>:<port>``."""

    def __init__(self, cluster: RedisCluster, reads: ClusterReads, supervisor: Supervisor,
                 ring: Callable[[str], None]) -> None:
        self.cluster = cluster
        self.reads = reads
        self.supervisor = supervisor
        self._ring = ring
        self._nodes: dict[str, _Node] = {}
        self._home: dict[str, _Node] = {}
        """Room -> the node it is subscribed (or to be) on."""
        self.resubscribes = 0
        """Rooms subscribed again elsewhere (slot moved, failover): for tests and logs."""

    def add(self, room: str) -> None:
        """Subscribe ``room``'s bell; the read that follows its confirmation is rung."""
        if room not in self._home:
            self._place(room, self._owner(room))

    def remove(self, room: str) -> None:
        node = self._home.pop(room, None)
        if node is not None:
            node.rooms.discard(room)
            node.send(_UNSUBSCRIBE, room)

    def held(self) -> int:
        """Rooms whose bells are subscribed (or to be): those added and not removed."""
        return len(self._home)

    async def aclose(self) -> None:
        nodes, self._nodes, self._home = list(self._nodes.values()), {}, {}
        for node in nodes:
            await self.supervisor.stop(_loop_name(node.name))

    # -- placement --------------------------------------------------------------------------------

    def _owner(self, room: str) -> str:
        """The name of the primary of ``room``'s slot in the current map (any primary when the
        map has none: its ``MOVED`` corrects it)."""
        holders = self.cluster.nodes_manager.slots_cache.get(key_slot(keys.room_bell(room).encode()))
        if holders:
            return str(holders[0].name)
        primaries = self.cluster.get_primaries()
        if not primaries:
            raise RuntimeError("the cluster's slot map names no primary")
        return str(primaries[0].name)

    def _place(self, room: str, name: str) -> None:
        node = self._nodes.get(name)
        if node is None:
            node = self._nodes[name] = _Node(name)
            self.supervisor.spawn(_loop_name(name), lambda: self._run(node))
        node.rooms.add(room)
        self._home[room] = node
        node.send(_SUBSCRIBE, room)

    def _rehome(self, node: _Node, rooms: set[str]) -> None:
        """Send each of ``rooms`` (of ``node``) where the map now says; those the map still puts
        on ``node`` are subscribed there again."""
        for room in rooms:
            if self._home.get(room) is not node:
                continue  # it left meanwhile
            owner = self._owner(room)
            if owner == node.name:
                node.send(_SUBSCRIBE, room)
                continue
            self.resubscribes += 1
            node.rooms.discard(room)
            self._place(room, owner)

    async def _refresh(self) -> None:
        try:
            await self.reads.refresh()
        except REDIS_DOWN as exc:  # a failover under way: the node's loop tries again
            log.debug("bells: slot map not refreshed: %s", exc)

    # -- one node's loop ----------------------------------------------------------------------------

    async def _run(self, node: _Node) -> None:
        """Keep ``node``'s connection subscribed to its rooms' bells. Returns once the node has no
        rooms and is no longer a primary of the map (its loop is started again if one comes)."""
        backoff = Backoff(cap=1.0)
        while True:
            while not node.rooms:
                if node.name not in {str(p.name) for p in self.cluster.get_primaries()}:
                    if self._nodes.get(node.name) is node:
                        del self._nodes[node.name]
                    return
                node.kick.clear()
                await node.kick.wait()
            try:
                await self._session(node, backoff)
            except REDIS_DOWN as exc:
                (log.warning if backoff.delay == backoff.first else log.debug)(
                    "bells on %s: redis unavailable (%s); again in %.1f s", node.name, exc, backoff.delay)
                await backoff.wait()
                await self._refresh()
                self._rehome(node, set(node.rooms))

    async def _session(self, node: _Node, backoff: Backoff) -> None:
        """One connection's life: subscribe every room of the node, then follow. Returns when the
        node has no rooms left; raises one of ``REDIS_DOWN`` when the connection is lost."""
        target = self.cluster.get_node(node_name=node.name)
        if target is None:
            raise ConnectionError(f"{node.name} is not in the slot map")
        connection = _connect(target)
        try:
            await connection.connect()  # type: ignore[no-untyped-call]
            version = _version(await _command(connection, "INFO", "server"))
            if int(version.split(".")[0]) < 7:
                raise RuntimeError(f"Redis Cluster mode needs Redis 7.0 or later (sharded pub/sub): {node.name} "
                                   f"runs {version} (docs/cluster.md)")
            node.sent.clear()
            node.moved.clear()
            node.outbox = [(_SUBSCRIBE, room) for room in node.rooms]
            node.connected = True
            node.kick.set()
            writer = asyncio.create_task(self._write(node, connection), name=f"{_loop_name(node.name)}:write")
            reader = asyncio.create_task(self._read(node, connection, backoff), name=f"{_loop_name(node.name)}:read")
            try:
                done, _ = await asyncio.wait((writer, reader), return_when=asyncio.FIRST_COMPLETED)
            finally:
                node.connected = False
                node.outbox.clear()
                for task in (writer, reader):
                    task.cancel()
                await asyncio.gather(writer, reader, return_exceptions=True)
            for task in done:
                task.result()  # the error that ended it, if any
        finally:
            await connection.disconnect(nowait=True)

    async def _write(self, node: _Node, connection: Connection) -> None:
        while True:
            if node.moved:
                # The node's own map may be ahead of the one asked: a moment for it to spread.
                await asyncio.sleep(MOVED_PAUSE_S)
                rooms, node.moved = node.moved, set()
                await self._refresh()
                before = self.resubscribes
                self._rehome(node, rooms)
                log.info("bells: %d of %d rooms left %s, subscribed at their new owner", self.resubscribes - before,
                         len(rooms), node.name)
                continue
            if not node.outbox:
                node.kick.clear()
                try:
                    async with asyncio.timeout(PING_EVERY_S):
                        await node.kick.wait()
                except TimeoutError:
                    node.outbox.append((_PING, ""))
                continue
            batch, node.outbox = node.outbox, []
            node.sent.extend(batch)
            await connection.send_packed_command(connection.pack_commands(
                [(command,) if command == _PING else (command, keys.room_bell(room)) for command, room in batch]),
                check_health=False)

    async def _read(self, node: _Node, connection: Connection, backoff: Backoff) -> None:
        while node.rooms or node.sent:
            try:
                reply: Any = await connection.read_response(timeout=PING_EVERY_S + REPLY_GRACE_S)
            except AskError:  # MOVED (or ASK): the map was stale for this room's slot
                command, room = node.sent.popleft()
                if command == _SUBSCRIBE and room in node.rooms:
                    node.moved.add(room)
                    node.kick.set()
                continue  # an unsubscribe answered MOVED: its slot left, nothing held there
            except ResponseError as exc:
                if isinstance(exc, REDIS_DOWN):  # CLUSTERDOWN, TRYAGAIN: as a lost connection
                    raise
                refused = node.sent[0] if node.sent else "?"
                raise RuntimeError(f"bells on {node.name}: {refused} refused: {exc}") from exc
            backoff.reset()
            if not isinstance(reply, list) or reply[0] == b"pong":
                # Replies come in order: whatever was sent before this PING is answered. (A reply
                # taken for a push, or the other way round, leaves no stale entry past here.)
                while node.sent and node.sent.popleft()[0] != _PING:
                    pass
                continue
            kind, room = reply[0], keys.room_of_key(reply[1].decode())
            if kind == b"smessage":
                if room in node.rooms:
                    self._ring(room)
            elif kind == b"ssubscribe":
                if node.sent and node.sent[0] == (_SUBSCRIBE, room):
                    node.sent.popleft()
                if room in node.rooms:
                    self._ring(room)  # a bell rung before this is gone: read once now
            elif kind == b"sunsubscribe":
                if node.sent and node.sent[0] == (_UNSUBSCRIBE, room):
                    node.sent.popleft()  # ours
                elif room in node.rooms:  # pushed: the room's slot left this node
                    log.debug("bells: room %s left %s; subscribing where the slot map says", room, node.name)
                    node.moved.add(room)
                    node.kick.set()


def _loop_name(node: str) -> str:
    return f"hub:bells:{node}"


def _connect(node: ClusterNode) -> Connection:
    """A connection of its own to ``node``, with the cluster client's settings (TLS included),
    named for operators; no socket timeout (replies are awaited with their own), RESP2 (pushes
    arrive as plain arrays, in line with the replies), no retries (the loop decides)."""
    kwargs = {k: v for k, v in node.connection_kwargs.items() if k != "event_dispatcher"}
    kwargs.update(client_name=CLIENT_NAME, socket_timeout=None, protocol=2,
                  retry=Retry(backoff=NoBackoff(), retries=0))
    return node.connection_class(**kwargs)


async def _command(connection: Connection, *command: Any) -> Any:
    await connection.send_command(*command, check_health=False)
    return await connection.read_response(timeout=REPLY_GRACE_S)


def _version(info: Any) -> str:
    text = info.decode() if isinstance(info, bytes) else str(info)
    for line in text.splitlines():
        if line.startswith("redis_version:"):
            return line.split(":", 1)[1].strip()
    return "0"
