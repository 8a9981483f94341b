"""Commands sent to the Redis Cluster node that holds their key (docs/cluster.md).

The job hand-off, the sweeper and the worker's job scripts are written against :class:`Calls`
(``await calls.call(*command)``), which :class:`voxroom.store.autopipe.AutoPipeline` also is: on a single
instance nothing changes. On a cluster the gateway gives the hand-off and the sweeper its per-node
autopipeline (``voxroom/store/cluster/pipeline.py``, the same ``call``); the worker's job scripts get a
:class:`ClusterCalls`: redis-py's ``RedisCluster`` for the slot map and the per-node connection
pools, the routing and the redirections done here. The slot is computed here, from the
command's first key (redis-py would parse some commands' keys with a ``COMMAND GETKEYS`` round
trip, and under many concurrent first calls it sent some to the wrong node).

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
from typing import Any, Protocol

from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import AskError, ClusterDownError, MovedError, SlotNotCoveredError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from voxroom.store.backoff import Backoff
from voxroom.store.cluster.slots import ClusterReads

_SUBCOMMANDS = ("XGROUP", "XINFO", "OBJECT")
"""Commands whose key follows a subcommand (``XGROUP CREATE key ...``)."""
REDIRECT_BUDGET_S = 10.0
"""How long one command may keep being redirected or told ``TRYAGAIN`` before the error stands."""
TRYAGAIN_FIRST_S = 0.01
TRYAGAIN_CAP_S = 0.5


class Calls(Protocol):
    async def call(self, *command: Any) -> Any: ...


class ClusterCalls:
    def __init__(self, cluster: RedisCluster) -> None:
        self.cluster = cluster
        self.reads = ClusterReads(cluster)
        """Its single-flight slot map refresh."""
        self.redirects = 0
        self.retries = 0
        """``TRYAGAIN`` answers sent again: for tests and logs."""

    async def call(self, *command: Any) -> Any:
        """Run ``command`` on the primary of its key's slot (all of its keys in one slot): the
        first key of an ``EVAL``, the first argument of any other command."""
        name = str(command[0]).upper()
        key = command[3] if name == "EVAL" else command[2] if name in _SUBCOMMANDS else command[1]
        return await self.call_at(key, *command)

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
