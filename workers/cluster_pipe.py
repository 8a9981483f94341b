"""The worker's Redis Cluster calls: its job scripts share one automatic pipeline per node.

:class:`~voxroom.store.cluster.calls.ClusterCalls` sends each command through redis-py's
``RedisCluster``: one round trip per command, a pooled connection taken and given back each time.
A worker publishing many rooms issues many small scripts at about the same moment (take,
publish, finish, ack, turn checks), so here :meth:`PipelinedClusterCalls.call` sends them through
a :class:`~voxroom.store.cluster.pipeline.ClusterAutoPipeline` instead: the commands of one loop turn
share one write and one read per node, as the single instance's ``AutoPipeline`` does for all.

What stays on redis-py (``call_at`` and the ``cluster`` client itself):

- **blocking reads** (``XREADGROUP ... BLOCK``, ``XREAD ... BLOCK``): one on a node's pipeline
  would hold back every command queued behind it for up to its ``BLOCK``;
- commands whose first argument is not their key (``XGROUP CREATE key ...``): the per-node
  pipeline routes by the first argument, redis-py asks the server where the key is.

Replies are Redis's own (RESP2, hiredis), as from ``AutoPipeline``: a text client's come decoded,
a bytes client's as bytes. The worker's callers read both shapes (stream entries as
``[id, [field, value, ...]]``).
"""

from __future__ import annotations

from typing import Any

from redis.asyncio.cluster import RedisCluster

from voxroom.store.cluster.calls import ClusterCalls
from voxroom.store.cluster.pipeline import ClusterAutoPipeline

SUBCOMMANDS = frozenset({"XGROUP", "XINFO", "OBJECT", "MEMORY", "CLIENT", "CONFIG", "FUNCTION", "SCRIPT"})
"""Commands whose first argument is a subcommand, not a key: sent through redis-py."""


class PipelinedClusterCalls(ClusterCalls):
    """:class:`ClusterCalls` whose :meth:`call` is pipelined per node (see the module docstring).
    Owns ``cluster`` and the pipelines: :meth:`aclose` closes both."""

    def __init__(self, cluster: RedisCluster, *, timeout_s: float = 5.0) -> None:
        super().__init__(cluster)
        # One slot map refresh (single-flight) serves the pipelines and the blocked reads alike.
        self.auto = ClusterAutoPipeline(cluster, reads=self.reads, timeout_s=timeout_s)

    async def call(self, *command: Any) -> Any:
        name = command[0].decode() if isinstance(command[0], bytes) else str(command[0])
        if name.upper() in SUBCOMMANDS:
            return await super().call(*command)
        # The slot map, once (a flag check afterwards): through the client's own initialize, or
        # its aclose would skip the connections the map was read on.
        await self.cluster.initialize()
        return await self.auto.call(*command)

    async def aclose(self) -> None:
        try:
            await self.auto.aclose()
        finally:
            await super().aclose()
