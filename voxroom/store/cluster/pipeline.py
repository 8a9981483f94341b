"""Automatic pipelining on a Redis Cluster: one :class:`~voxroom.store.autopipe.AutoPipeline` per
primary, each command sent to the pipeline of its key's slot's node.

The commands many tasks issue in one loop turn still share one write and one read **per node**
(the single-instance path shares one for all). A group whose commands lie on several nodes is
split by node, each part sent in order on its node's connection, and the replies put back in the
group's order: ordered per node, not across nodes (a group is not atomic on one Redis either;
commands of one room always lie on one node).

On TLS nodes (``rediss://``) each node's pipeline sends its batches through a redis-py pool of
that node instead of one connection (``voxroom.store.autopipe.tls_client``), with the cluster client's
TLS options (:func:`_node_client`): raw replies and whole error replies, as on a plain node.

Routing: each command by its key (``voxroom/store/cluster/routing.py``, the one rule); a command
without keys (``PING``) goes to any primary.

Redirections, each command on its own (a ``MOVED``, ``ASK`` or ``TRYAGAIN`` command did not run,
so sending it again is safe; a connection lost with commands in flight is the ambiguous case, as on one Redis):

- ``MOVED``: the slot map is asked again (``ClusterReads.refresh``, one refresh for all the
  commands that hit it) and the command is sent to the node it names;
- ``ASK``: ``ASKING`` and the command, back to back on the target's pipeline (one connection,
  so ``ASKING`` applies to that command);
- ``TRYAGAIN`` (a script over several keys of a migrating slot, its keys split between the two
  nodes or some not yet on the target): sent again to the slot's owner after a backoff
  (``voxroom.store.cluster.calls``'s ``TRYAGAIN_FIRST_S`` doubling to ``TRYAGAIN_CAP_S``);
- at most :data:`MAX_REDIRECTS` redirections and ``REDIRECT_BUDGET_S`` (10 s) for one command,
  then the last error reply stands (``TRYAGAIN`` raised as ``TryAgainError``, one of
  ``REDIS_DOWN``: the gateway answers ``unavailable`` and the client resends the same ``seq``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from redis.asyncio import ConnectionPool, Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.connection import SSLConnection
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError, SlotNotCoveredError
from redis.exceptions import TimeoutError as RedisTimeoutError

from voxroom.store.autopipe import SSL_OPTIONS, AutoPipeline, redis_error
from voxroom.store.backoff import Backoff
from voxroom.store.cluster.calls import REDIRECT_BUDGET_S, TRYAGAIN_CAP_S, TRYAGAIN_FIRST_S
from voxroom.store.cluster.routing import command_key
from voxroom.store.cluster.slots import ClusterReads
from voxroom.store.interface import Command

MAX_REDIRECTS = 16
"""``MOVED``/``ASK`` followed for one command before the last error reply stands: a command of a
slot in migration may bounce source (ASK) -> target (TRYAGAIN) -> source a few times."""


class ClusterAutoPipeline:
    """The :class:`~voxroom.store.interface.Commands` interface over ``cluster``'s primaries. Each node's
    pipeline keeps ``AutoPipeline``'s own bounds and timeouts (``max_inflight``, ``timeout_s``)."""

    def __init__(self, cluster: RedisCluster, *, reads: ClusterReads | None = None, timeout_s: float = 5.0,
                 max_inflight: int = 10_000, max_hold_s: float | None = None) -> None:
        self.cluster = cluster
        self.reads = reads or ClusterReads(cluster)
        self.timeout_s = timeout_s
        self.max_inflight = max_inflight
        self.max_hold_s = max_hold_s
        self._pipes: dict[str, AutoPipeline] = {}
        self.retries = 0
        """``TRYAGAIN`` answers sent again."""

    @property
    def batches_sent(self) -> int:
        return sum(p.batches_sent for p in self._pipes.values())

    def _pipe(self, node: ClusterNode) -> AutoPipeline:
        pipe = self._pipes.get(node.name)
        if pipe is None:
            pipe = AutoPipeline(_node_client(node), timeout_s=self.timeout_s,
                                max_inflight=self.max_inflight, max_hold_s=self.max_hold_s)
            self._pipes[node.name] = pipe
        return pipe

    async def _node_of(self, command: Command) -> ClusterNode:
        key = command_key(command)
        for _ in range(2):
            if key is None:
                nodes = self.cluster.get_primaries()
                if nodes:
                    return nodes[0]
            else:
                slot = key_slot(key.encode() if isinstance(key, str) else bytes(key))
                holders = self.cluster.nodes_manager.slots_cache.get(slot)
                if holders:
                    return holders[0]
            await self.reads.refresh()
        raise SlotNotCoveredError(f"no node holds the slot of {key!r}")

    async def pipe_for(self, key: str | bytes) -> AutoPipeline:
        """The pipeline of the node that holds ``key``'s slot now (the slot map read again first
        when no node holds it; ``SlotNotCoveredError`` if still none). For a command that has to go
        out on the one connection another command of that key went out on (``WAIT`` after a
        room's accept, ``voxroom/store/cluster/ingress.py``): its commands are not routed, so a ``MOVED`` or ``ASK``
        they get is the caller's to handle."""
        return self._pipe(await self._node_of(("GET", key)))

    async def call(self, *command: Any) -> Any:
        return (await self.group([command]))[0]

    async def capacity(self) -> None:
        """Each node's pipeline waits for its own capacity (in :meth:`replies`)."""

    def submit(self, commands: Sequence[Command]) -> asyncio.Future[list[Any]]:
        """As :meth:`replies`, for a loop callback: routing and redirections need awaits, so this
        is a task (the commands go out with the next loop turn's batch of their node)."""
        return asyncio.ensure_future(self.replies(commands))

    def flush(self) -> None:
        """Nothing to do: each node's pipeline sends at the end of the loop turn."""

    async def group(self, commands: Sequence[Command]) -> list[Any]:
        """As :meth:`AutoPipeline.group`: replies in order, the first error reply raised."""
        replies = await self.replies(commands)
        for reply in replies:
            if isinstance(reply, Exception):
                raise redis_error(reply) if isinstance(reply, ResponseError) else reply
        return replies

    async def replies(self, commands: Sequence[Command]) -> list[Any]:
        """Replies in order, error replies in place (redirections followed first)."""
        parts: dict[str, tuple[ClusterNode, list[int]]] = {}
        for i, command in enumerate(commands):
            node = await self._node_of(command)
            parts.setdefault(node.name, (node, []))[1].append(i)
        replies: list[Any] = [None] * len(commands)
        try:
            results = await asyncio.gather(*(self._pipe(node).replies([commands[i] for i in at])
                                             for node, at in parts.values()))
        except (RedisConnectionError, RedisTimeoutError, OSError):
            # That node may be gone (a failover): the next command is routed on a fresh map.
            await asyncio.gather(self.reads.refresh(), return_exceptions=True)
            raise
        for (_node, at), got in zip(parts.values(), results, strict=True):
            for i, reply in zip(at, got, strict=True):
                replies[i] = reply
        redirected = [i for i, reply in enumerate(replies) if _retry(reply)]
        if redirected:
            again = await asyncio.gather(*(self._follow(commands[i], replies[i]) for i in redirected))
            for i, reply in zip(redirected, again, strict=True):
                replies[i] = reply
        return replies

    async def _follow(self, command: Command, reply: ResponseError) -> Any:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REDIRECT_BUDGET_S
        backoff = Backoff(TRYAGAIN_FIRST_S, TRYAGAIN_CAP_S)
        redirects = 0
        while True:
            if str(reply).startswith("TRYAGAIN"):
                # Its slot is migrating and its keys are split between the two nodes (or some
                # do not exist yet on the target): it did not run. Again after a pause, from the
                # slot's owner, which answers ASK or MOVED once the keys have moved.
                self.retries += 1
                if loop.time() + backoff.delay > deadline:
                    return reply
                await backoff.wait()
                reply = (await self._pipe(await self._node_of(command)).replies([command]))[0]
                if not _retry(reply):
                    return reply
                continue
            redirects += 1
            if redirects > MAX_REDIRECTS or loop.time() > deadline:
                return reply
            kind, _slot, address = str(reply).split(" ", 2)
            self.reads.redirects += 1
            if kind == "MOVED":
                await self.reads.refresh()
                reply = (await self._pipe(await self._node_of(command)).replies([command]))[0]
            else:
                host, _, port = address.rpartition(":")
                target = self.cluster.get_node(host=host, port=int(port))
                if target is None:
                    await self.reads.refresh()
                    target = self.cluster.get_node(host=host, port=int(port))
                if target is None:
                    return reply
                reply = (await self._pipe(target).replies([("ASKING",), command]))[1]
            if not _retry(reply):
                return reply

    async def aclose(self) -> None:
        pipes, self._pipes = list(self._pipes.values()), {}
        await asyncio.gather(*(p.aclose() for p in pipes), return_exceptions=True)


def _node_client(node: ClusterNode) -> Redis:
    """A client that only carries ``node``'s connection settings, those the cluster client was
    given (``rediss://``: TLS with its ``ssl_*`` options, client certificate included); it never
    opens a connection itself. :class:`AutoPipeline` opens its own from them: one lean connection
    on plain TCP, its own redis-py pool on TLS (``voxroom.store.autopipe.tls_client``)."""
    kw = node.connection_kwargs
    common: dict[str, Any] = {"host": node.host, "port": int(node.port), "username": kw.get("username"),
                              "password": kw.get("password"), "decode_responses": bool(kw.get("decode_responses")),
                              "socket_connect_timeout": kw.get("socket_connect_timeout")}
    connection_class = node.connection_class
    if not issubclass(connection_class, SSLConnection):
        return Redis(**common)
    tls = {k: v for k, v in kw.items() if k in SSL_OPTIONS}
    return Redis.from_pool(ConnectionPool(connection_class=connection_class, **common, **tls))


def _retry(reply: Any) -> bool:
    """A reply saying the command did not run and where (or when) to send it again."""
    return isinstance(reply, ResponseError) and str(reply).startswith(("MOVED ", "ASK ", "TRYAGAIN"))
