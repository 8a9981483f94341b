"""Commands sent one at a time to the Redis Cluster node that holds their key (docs/cluster.md):
the blocked reads of the worker's job shards, which must not sit on a node's autopipeline
(``voxroom/store/cluster/pipeline.py``, where every other command goes). redis-py's
``RedisCluster`` gives the slot map and the per-node connection pools; the routing
(``voxroom/store/cluster/routing.py``) and the redirections are done here.

**Why not ``RedisCluster.execute_command``.** It follows ``MOVED`` itself, but every fifth
``MOVED`` (its ``reinitialize_steps``) it closes *every* connection of the client, so one slot
moving kills the other tasks' commands in flight: a resharding made the worker's blocked shard
reads and its publishes fail with "Connection closed by server" (seen with
``tests/cluster/test_cluster_reshard.py``). Here each command goes to one node's pool
(``ClusterNode.execute_command``, which parses the reply as redis-py would) and:

- ``MOVED`` (the migration finished, a failover): the slot map is asked again (one refresh for
  every command that hit it, ``ClusterReads.refresh``) and the command sent to the new owner;
- ``ASK`` (the slot is migrating and this key left, or does not exist yet): ``ASKING`` and the
  command back to back on one connection of the target (``ASKING`` holds for the next command of
  its connection only);
- ``TRYAGAIN`` (a command over several keys of a migrating slot whose keys are split between
  the two nodes, or some missing on the target): sent again after a backoff (:data:`TRYAGAIN_FIRST_S`
  doubling to :data:`TRYAGAIN_CAP_S`), for at most :data:`REDIRECT_BUDGET_S`: a slot's keys move
  within milliseconds (``redis-cli --cluster reshard`` migrates a few keys per ``MIGRATE``);
  past the budget the ``TryAgainError`` is raised, one of ``REDIS_DOWN`` for the caller to back
  off on.

A redirected or ``TRYAGAIN`` command did not run, so sending it again is safe. A connection lost
with the command in flight is ambiguous: the slot map is refreshed and the error raised, as on a
single Redis (callers treat it as Redis unavailable). The client: ``voxroom.store.clients.cluster_client``.
"""

from __future__ import annotations

import asyncio
from typing import Any

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import AskError, ClusterDownError, MovedError, SlotNotCoveredError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from voxroom.store.backoff import Backoff
from voxroom.store.cluster.routing import command_key
from voxroom.store.cluster.slots import ClusterReads

REDIRECT_BUDGET_S = 10.0
"""How long one command may keep being redirected or told ``TRYAGAIN`` before the error stands."""
TRYAGAIN_FIRST_S = 0.01
TRYAGAIN_CAP_S = 0.5


class ClusterCalls:
    """Commands sent one at a time through redis-py's per-node pools: for the blocked reads
    (``XREADGROUP ... BLOCK``), which on a node's autopipeline would hold back every command queued
    behind them. Everything else goes through ``ClusterAutoPipeline``."""

    def __init__(self, cluster: RedisCluster, reads: ClusterReads | None = None) -> None:
        self.cluster = cluster
        self.reads = reads or ClusterReads(cluster)
        """The single-flight slot map refresh (shared with the store's other cluster paths)."""
        self.redirects = 0
        self.retries = 0
        """``TRYAGAIN`` answers sent again: for tests and logs."""

    async def call(self, *command: Any) -> Any:
        """Run ``command`` on the primary of its key's slot (all of its keys in one slot; the
        key as ``voxroom/store/cluster/routing.py`` finds it)."""
        key = command_key(command)
        if key is None:
            raise ValueError(f"{command[0]!r} has no key to route it by")
        return await self.call_at(key.decode() if isinstance(key, bytes) else str(key), *command)

    async def call_at(self, key: str, *command: Any) -> Any:
        """Run ``command`` on the primary that holds ``key``: for commands whose keys redis-py
        would ask the server to find. Redirections and ``TRYAGAIN`` are followed (see the
        module's docstring); raises one of ``REDIS_DOWN`` when the node cannot serve it, and the
        command's own error replies."""
        await self.cluster.initialize()  # the slot map, once (a flag check afterwards)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REDIRECT_BUDGET_S
        backoff = Backoff(TRYAGAIN_FIRST_S, TRYAGAIN_CAP_S)
        ask: ClusterNode | None = None
        moved: ClusterNode | None = None
        while True:
            node = ask or moved or await self._node_of(key)
            moved = None
            try:
                if ask is not None:
                    ask = None
                    return await _asking(node, command)
                return await node.execute_command(*command)
            except MovedError as exc:
                self.redirects += 1
                if loop.time() > deadline:
                    raise
                await self.reads.refresh()
                # To the node it names: the map may not say so yet, and it is right even when
                # ``key`` was not the command's key.
                moved = self.cluster.get_node(host=exc.host, port=exc.port)
            except AskError as exc:
                self.redirects += 1
                if loop.time() > deadline:
                    raise
                ask = self.cluster.get_node(host=exc.host, port=exc.port)
                if ask is None:  # a node the map does not know yet
                    await self.reads.refresh()
                    ask = self.cluster.get_node(host=exc.host, port=exc.port)
            except TryAgainError:
                self.retries += 1
                if loop.time() + backoff.delay > deadline:
                    raise
                await backoff.wait()
            except (RedisConnectionError, RedisTimeoutError, OSError):
                # The node may be gone (a failover): the next call is routed on a fresh map.
                try:
                    await self.reads.refresh()
                except ClusterDownError:
                    pass
                raise

    async def _node_of(self, key: str) -> ClusterNode:
        try:
            node = self.cluster.get_node_from_key(key)
        except SlotNotCoveredError:
            await self.reads.refresh()
            node = self.cluster.get_node_from_key(key)
        if node is None:
            raise SlotNotCoveredError(f"no node holds the slot of {key!r}")
        return node

    async def aclose(self) -> None:
        await self.cluster.aclose()


async def _asking(node: ClusterNode, command: tuple[Any, ...]) -> Any:
    """``ASKING`` then ``command`` on one connection of ``node``; the command's reply parsed as
    ``ClusterNode.execute_command`` parses it. A connection left with a reply owed is closed."""
    connection = node.acquire_connection()
    clean = False
    try:
        await node.disconnect_if_needed(connection)
        await connection.send_packed_command(connection.pack_commands([("ASKING",), command]))
        await connection.read_response()  # +OK
        try:
            reply = await node.parse_response(connection, command[0])
        except Exception:
            clean = True  # an error reply was read whole: the connection is in step
            raise
        clean = True
        return reply
    finally:
        if not clean:
            await asyncio.shield(connection.disconnect(nowait=True))
        node.release(connection)
