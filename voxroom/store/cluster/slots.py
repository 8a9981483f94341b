"""Blocked reads of one stream on a Redis Cluster: sent to the node that holds the stream's slot,
following ``MOVED``, ``ASK`` and failovers, from a cursor that does not depend on the node; and
the single-flight slot map refresh every cluster path here shares (:meth:`ClusterReads.refresh`).

**One blocked read per waiter.** A cluster refuses a command whose keys lie in more than one slot
(``CROSSSLOT``), even when one node holds all of them: a node that holds every slot answers
``XREAD STREAMS vx:room:{a}:out vx:room:{b}:out 0 0`` with ``CROSSSLOT`` (tried on Redis 7.0).
So the single-instance stream watcher's one ``XREAD`` over many rooms plus a wake stream becomes,
on a cluster, a blocked ``XREAD`` of its own per waiter (a worker's turn wait, the speech API's
waits: ``voxroom/store/single/watcher.py``), on a pooled connection to the room's node; one cancelled
(the connection, with a reply still owed) is closed rather than pooled. The gateway hub reads its
rooms without blocking, when their bell rings (``voxroom/store/cluster/fanout.py``): a connection per
room there would bound rooms by the nodes' ``maxclients``.

**Redirections.** The slot map is redis-py's ``RedisCluster`` one (``CLUSTER SLOTS`` at start):

- ``MOVED`` (the slot's migration finished, or a failover promoted a replica): the map is asked
  again (one refresh for every read that hit it at once) and the read is sent again to the new
  owner, after the same id. A stream keeps its entry ids when its key migrates, so nothing read
  is read twice and nothing written is skipped.
- ``ASK`` (the slot is migrating and this key already went): ``ASKING`` and a *non-blocking*
  ``XREAD`` on the target, on one connection, then :data:`ASK_PAUSE_S` before the next read
  (only while a migration is under way; it ends with ``MOVED``).
- A connection lost or refused (the node died): the map is asked again; when it names another
  node for the key (a replica was promoted) the read goes there at once, otherwise the error is
  raised (one of ``REDIS_DOWN``) for the caller to back off and retry from the same cursor, which
  repeats until the promotion.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    RedisClusterException,
    ResponseError,
    SlotNotCoveredError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from voxroom.store.backoff import READ_DEADLINE_S

log = logging.getLogger("voxroom.cluster")

ASK_PAUSE_S = 0.05
"""Between two reads of a key whose slot is migrating (ASK): the only polling, and only then."""
REPLY_GRACE_S = READ_DEADLINE_S
"""A blocked read's reply may come this long after its BLOCK before the connection counts as lost."""


class ClusterReads:
    """Routed single-stream reads over one ``RedisCluster`` (``decode_responses=False`` for the
    hub: entries carry audio). Replies are Redis's own (``[[key, [[id, [field, value...]]]]]``
    or ``None``), as the single-instance readers get them from ``voxroom/store/autopipe.py``."""

    def __init__(self, cluster: RedisCluster) -> None:
        self.cluster = cluster
        self._refreshing: asyncio.Task[None] | None = None
        self.refreshes = 0
        self.redirects = 0

    async def refresh(self) -> None:
        """Ask the cluster for its slot map again. After a resharding every read of a moved room
        hits ``MOVED`` at about the same moment: one ``CLUSTER SLOTS`` serves them all. Raises
        ``ClusterDownError`` when no node can give a complete map now (a failover under way)."""
        if self._refreshing is None or self._refreshing.done():
            self._refreshing = asyncio.create_task(self._refresh(), name="cluster:slot-map")
        await asyncio.shield(self._refreshing)

    async def _refresh(self) -> None:
        self.refreshes += 1
        try:
            await self.cluster.nodes_manager.initialize()
        except RedisClusterException as exc:  # not one of REDIS_DOWN by its class: translated here
            raise ClusterDownError(f"no complete slot map now: {exc}") from None

    async def xread(self, key: str, after: str, *, count: int, block_ms: int) -> Any:
        """``XREAD COUNT count BLOCK block_ms STREAMS key after`` on the node of ``key``'s slot.
        ``None`` when nothing came (block elapsed, or a redirection was followed: call again with
        the same ``after``). Raises one of ``REDIS_DOWN`` when the node cannot be reached."""
        try:
            node = self.cluster.get_node_from_key(key)
        except SlotNotCoveredError:
            await self.refresh()
            return None
        assert node is not None
        try:
            return (await _on_node(node, [("XREAD", "COUNT", count, "BLOCK", block_ms, "STREAMS", key, after)],
                                   block_ms / 1000 + REPLY_GRACE_S))[0]
        except MovedError as exc:
            self.redirects += 1
            log.info("cluster: %s moved to %s:%s (slot %s); slot map refreshed", key, exc.host, exc.port,
                     exc.slot_id)
            await self.refresh()
            return None
        except AskError as exc:
            self.redirects += 1
            target = self.cluster.get_node(host=exc.host, port=exc.port)
            if target is None:  # a node the map does not know yet
                await self.refresh()
                return None
            reply = (await _on_node(target, [("ASKING",), ("XREAD", "COUNT", count, "STREAMS", key, after)],
                                    REPLY_GRACE_S))[1]
            if reply is None:
                await asyncio.sleep(ASK_PAUSE_S)
            return reply
        except ResponseError as exc:
            if not str(exc).startswith("UNBLOCKED"):
                raise
            # Redis 7 ends an XREADGROUP blocked on a key a resharding took away with
            # ``UNBLOCKED the stream key no longer exists`` (a plain XREAD waits for its BLOCK):
            # nothing was read, ask again (MOVED or ASK next).
            return None
        except (RedisConnectionError, RedisTimeoutError, OSError):
            try:
                await self.refresh()
            except ClusterDownError as down:
                log.debug("cluster: slot map not refreshed: %s", down)
                raise
            with contextlib.suppress(SlotNotCoveredError):
                if getattr(self.cluster.get_node_from_key(key), "name", None) != node.name:
                    return None  # a replica was promoted meanwhile: read there now, not after a backoff
            raise


async def _on_node(node: ClusterNode, commands: list[tuple[Any, ...]], timeout_s: float) -> list[Any]:
    """Send ``commands`` back to back on one pooled connection of ``node`` (``ASKING`` must share
    the connection of the command it allows); their raw replies, the first error raised. A
    connection left with replies owed (error, cancellation) is closed, never pooled."""
    connection = node.acquire_connection()
    clean = False
    try:
        await connection.send_packed_command(connection.pack_commands(commands))
        replies = []
        for _ in commands:
            replies.append(await connection.read_response(timeout=timeout_s))
        clean = True
        return replies
    finally:
        if not clean:
            await asyncio.shield(connection.disconnect(nowait=True))
        node.release(connection)
