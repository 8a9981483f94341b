"""Commands sent to the Redis Cluster node that holds their key (docs/cluster.md).

The job hand-off, the sweeper and the worker's job scripts are written against :class:`Calls`
(``await calls.call(*command)``), which :class:`voxroom.autopipe.AutoPipeline` also is: on a single
instance nothing changes. On a cluster the gateway gives the hand-off and the sweeper its per-node
autopipeline (``voxroom/cluster_autopipe.py``, the same ``call``); the worker's job scripts get a
:class:`ClusterCalls`, redis-py's ``RedisCluster`` underneath: it routes each command by its
key's slot, follows ``MOVED`` and refreshes its slot map. The slot is computed here, from the
command's first key (redis-py would parse some commands' keys with a ``COMMAND GETKEYS`` round
trip, and under many concurrent first calls it sent some to the wrong node); a ``MOVED``
refreshes the slot map and the command is sent once more (a ``MOVED`` command did not run).
The client: ``voxroom.redis_client.cluster_client``.
"""

from __future__ import annotations

from typing import Any, Protocol

from redis.asyncio.cluster import RedisCluster
from redis.exceptions import MovedError


class Calls(Protocol):
    async def call(self, *command: Any) -> Any: ...


class ClusterCalls:
    def __init__(self, cluster: RedisCluster) -> None:
        self.cluster = cluster

    async def call(self, *command: Any) -> Any:
        """Run ``command`` on the primary of its key's slot (all of its keys in one slot): the
        first key of an ``EVAL``, the first argument of any other command."""
        key = command[3] if str(command[0]).upper() == "EVAL" else command[1]
        return await self.call_at(key, *command)

    async def call_at(self, key: str, *command: Any) -> Any:
        """Run ``command`` on the primary that holds ``key``: for commands whose keys redis-py
        would ask the server to find. One retry after a ``MOVED`` (the slot map is refreshed)."""
        for attempt in (0, 1):
            await self.cluster.initialize()  # the slot map, once (a flag check afterwards)
            node = self.cluster.get_node_from_key(key)
            try:
                return await self.cluster.execute_command(*command, target_nodes=node)
            except MovedError:
                if attempt:
                    raise
                await self.cluster.nodes_manager.initialize()
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        await self.cluster.aclose()

