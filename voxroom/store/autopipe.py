"""Automatic pipelining: the Redis commands that many tasks issue in one event-loop turn travel
to Redis together, on one connection, and their replies come back in one read.

A worker publishing 100 rooms, or a gateway taking 100 rooms' lines, issues many small commands
at about the same moment, one per task. Through redis-py each pays a pooled connection taken and
given back, a timeout Task, and its per-command parsing: about 80 µs a command here, and on two
cores that cost times the rooms was most of what a burst of rooms added to their latency
(docs/benchmarks.md). Here a command is queued, and one callback at the end of the current loop
turn packs everything queued by then into one write. A quiet room pays nothing extra: its
command leaves in the loop turn it was issued, alone.

**One connection, true pipelining.** Writes never wait for earlier replies; Redis answers in
order, so the connection's protocol hands replies to their callers first in, first out, in the
loop callback that reads them (hiredis parses them; error replies are values, so one failing
command never desynchronises the others).
Commands of one :meth:`AutoPipeline.group` go out back to back and in order, but without MULTI:
a group is ordered, not atomic (use a script for atomicity, as ``EVAL`` here).

**Failures.** Error replies become redis-py's exception classes (:func:`redis_error`:
``-LOADING`` is ``BusyLoadingError``, ``-OOM`` ``OutOfMemoryError``...), so one retry loop
catches "Redis unavailable" (``voxroom.store.backoff.REDIS_DOWN``) whichever client raised it. A
command that cannot be encoded (a lone surrogate in a string, a ``None``) fails alone, at the
call: the others queued in the same loop turn still go out. A lost connection fails every command
in flight with redis-py's ``ConnectionError`` and the next command reconnects. A reply that takes
longer than ``timeout_s`` fails everything in flight the same way, after one short grace read: a
process paused (SIGSTOP) or a loop blocked for longer than the timeout finds its replies already
waiting in the socket, and they are not a dead Redis. ``max_inflight`` commands at most are sent
and unanswered; callers beyond it wait for replies to drain (back-pressure instead of an
unbounded buffer).

For TLS connections (``rediss://``) the same interface runs on redis-py's own pipelines (one per
loop turn) on a pool of this pipeline's own (:func:`tls_client`), which keeps the batching but not
the leaner path. The replies and errors stay the lean path's: raw RESP2 replies (``HGETALL`` a flat
list, ``EXPIRE`` an integer), error replies whole, in place (``LOADING ...``, not redis-py's
``BusyLoadingError`` raised for the whole batch), mapped by :func:`redis_error` alike.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections import deque
from collections.abc import Sequence
from typing import Any, cast

import hiredis
from redis._parsers import _AsyncHiredisParser
from redis._parsers.base import BaseParser
from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.connection import AbstractConnection, Connection, SSLConnection, UnixDomainSocketConnection
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import DataError, OutOfMemoryError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from voxroom.store.backoff import CONNECT_TIMEOUT_S
from voxroom.store.clients import POOL_MAX_CONNECTIONS, POOL_WAIT_S
from voxroom.store.interface import Command

log = logging.getLogger("voxroom.store.autopipe")

_Waiter = tuple[int, list[Any], "asyncio.Future[list[Any]]"]


GRACE_READ_S = 1.0
"""After ``timeout_s`` without a reply, one more read this long before giving up (see above)."""


def pack(commands: Sequence[Command]) -> bytes:
    """RESP for ``commands`` (str, bytes, memoryview, int and float arguments), packed by hiredis:
    a 400-argument XREAD takes 25 µs there, 65 in a Python loop and 210 in redis-py. Raises
    ``DataError`` for an argument that cannot be sent (a bool, ``None``, a string with a lone
    surrogate that has no UTF-8 form)."""
    try:
        return b"".join([hiredis.pack_command(tuple(command)) for command in commands])
    except (TypeError, UnicodeError) as exc:
        raise DataError(f"cannot send that to Redis: {exc}") from None


def redis_error(reply: ResponseError) -> ResponseError:
    """An error reply as redis-py's own parser would raise it (``-LOADING`` as
    ``BusyLoadingError``, ``-OOM`` as ``OutOfMemoryError``, ``-READONLY``, ``-MASTERDOWN``...).
    An error raised inside a script (``ERR ... OOM command not allowed ...``) counts as OOM too."""
    message = str(reply)
    mapped: ResponseError = BaseParser.parse_error(message)  # type: ignore[no-untyped-call]
    if type(mapped) is ResponseError and "OOM command not allowed" in message:
        return OutOfMemoryError(message)
    return mapped


class _WholeErrors(_AsyncHiredisParser):
    """redis-py's hiredis parser with error replies as the lean path reads them: a
    ``ResponseError`` with the whole text, returned in place. redis-py's own ``parse_error`` cuts
    the first word off (``MovedError("3999 host:port")``, ``OutOfMemoryError("command not
    allowed...")``, which :func:`redis_error` could no longer map) and makes ``-LOADING`` a
    ``BusyLoadingError``, a ``ConnectionError`` that it raises: the whole pipeline would fail and
    the connection close for one command's reply."""

    @classmethod
    def parse_error(cls, response: str) -> ResponseError:
        return ResponseError(response)


def tls_client(connection_class: type[AbstractConnection], connection_kwargs: dict[str, Any],
               timeout_s: float) -> Redis:
    """The redis-py client :class:`AutoPipeline` sends its batches through where it cannot open
    its lean connection (TLS): ``connection_class`` with ``connection_kwargs`` (host, port, the
    ``ssl_*`` options...), so that its replies are the lean path's. RESP2 without redis-py's reply
    callbacks (``HGETALL`` a flat list, ``EXPIRE`` an integer, whatever redis-py's default
    protocol); error replies whole and in place (:class:`_WholeErrors`); no retry
    (redis-py 8.1's default too, pinned: a pipeline retried after a lost connection would send
    commands that may have run again; the lean path fails them instead, once); replies read within
    the pipeline's ``timeout_s``, not the client's socket timeout (a blocked read may ask for
    longer); a pool bounded and blocking as ``redis_client.from_url``'s. The caller closes it (``aclose``)."""
    options = {k: v for k, v in connection_kwargs.items() if k in _CONNECTION_OPTIONS}
    options |= {"protocol": 2, "socket_timeout": timeout_s, "parser_class": _WholeErrors,
               "retry": Retry(NoBackoff(), 0)}
    pool = BlockingConnectionPool(connection_class=connection_class, max_connections=POOL_MAX_CONNECTIONS,
                                  timeout=POOL_WAIT_S, **options)
    client = Redis.from_pool(pool)
    client.response_callbacks.clear()
    return client


SSL_OPTIONS = frozenset(inspect.signature(SSLConnection.__init__).parameters) - {"self", "kwargs"}
"""The ``ssl_*`` keyword arguments redis-py's ``SSLConnection`` takes (they vary by version)."""

_CONNECTION_OPTIONS = SSL_OPTIONS | {
    "host", "port", "db", "username", "password", "credential_provider", "client_name", "decode_responses",
    "encoding", "encoding_errors", "socket_connect_timeout", "socket_keepalive", "socket_keepalive_options"}
"""What :func:`tls_client` takes over from a pool's connection options: the server, the login and
TLS. Not the rest: redis-py's pool puts its own objects there (its RESP3 maintenance notification
handler, which a RESP2 connection refuses)."""


class AutoPipeline:
    """:class:`voxroom.store.interface.Commands` on one Redis connection (see the module's docstring)."""

    def __init__(self, redis: Redis, *, max_batch: int = 512, max_inflight: int = 10_000,
                 timeout_s: float = 5.0, max_hold_s: float | None = None) -> None:
        self.redis = redis
        self.max_batch = max_batch
        # None: what one loop turn queues leaves in one write at the turn's end, however long the
        # turn. A number: a command queued that long ago leaves with the next one queued after
        # it, so Redis (on another core) runs the first commands of a long turn while the loop
        # works on the rest. For a caller whose turns can be long (the gateway's says of a burst
        # of rooms, each handled in Python first): docs/benchmarks.md.
        self.max_hold_s = max_hold_s
        self.max_inflight = max_inflight
        self.timeout_s = timeout_s
        self._queued: list[tuple[Sequence[Command], asyncio.Future[list[Any]]]] = []
        self._scheduled = False
        self._held_since = 0.0
        pool = redis.connection_pool
        cls = pool.connection_class
        lean = issubclass(cls, UnixDomainSocketConnection) or (
            issubclass(cls, Connection) and not issubclass(cls, SSLConnection))
        self._wire: _Wire | None = _Wire(pool.connection_kwargs, timeout_s) if lean else None
        self.one_connection = lean
        """Whether everything goes out on one connection (``False`` on TLS, whose batches go
        through redis-py's pool): a ``WAIT`` then counts the writes of the commands before it."""
        self._tls: Redis | None = None if lean else tls_client(cls, pool.connection_kwargs, timeout_s)
        self._batches: set[asyncio.Task[None]] = set()
        self.batches_sent = 0
        self.commands_sent = 0

    async def call(self, *command: Any) -> Any:
        """One command; its reply, or its error raised."""
        return (await self.group([command]))[0]

    async def group(self, commands: Sequence[Command]) -> list[Any]:
        """Several commands, sent together and in order; their replies. The first error reply is
        raised (after every command of the group ran, as with a redis-py pipeline)."""
        replies = await self.replies(commands)
        for reply in replies:
            if isinstance(reply, Exception):
                raise redis_error(reply) if isinstance(reply, ResponseError) else reply
        return replies

    async def replies(self, commands: Sequence[Command]) -> list[Any]:
        """As :meth:`group`, with error replies returned in place instead of raised (the cluster
        pipeline, ``voxroom/store/cluster/pipeline.py``, follows ``MOVED`` and ``ASK`` replies). A
        lost connection still raises."""
        await self.capacity()
        return await self.submit(commands)

    async def capacity(self) -> None:
        """Wait while ``max_inflight`` commands are unanswered (a caller of :meth:`submit` that
        can await waits here first)."""
        if self._wire is not None and self._wire.inflight >= self.max_inflight:
            await self._wire.drained()

    def submit(self, commands: Sequence[Command]) -> asyncio.Future[list[Any]]:
        """As :meth:`replies`, for a loop callback that cannot await: the future of the replies
        (error replies in place). The caller bounds what it submits (see :meth:`capacity`)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[list[Any]] = loop.create_future()
        self._queued.append((commands, future))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        if self.max_hold_s is not None:
            # time.monotonic, not loop.time: uvloop's clock counts whole milliseconds.
            now = time.monotonic()
            if len(self._queued) == 1:
                self._held_since = now
            elif now - self._held_since >= self.max_hold_s:
                self._send_queued()  # the end-of-turn flush is still due, for what comes next
        return future

    def flush(self) -> None:
        """Send what is queued now instead of at the end of this loop turn. For a callback
        that itself runs at the end of a loop turn, after what it gathers was queued (the
        worker's batched publish, voxroom/store/jobs.py): its commands then leave in the same turn
        rather than one turn later. Order is kept: everything queued so far goes, in order, and
        later commands go in a later write on the same connection."""
        if self._queued:
            self._flush()

    def _flush(self) -> None:
        self._scheduled = False
        self._send_queued()

    def _send_queued(self) -> None:
        if not self._queued:  # sent already by flush() or a held command
            return
        queued, self._queued = self._queued, []
        try:
            self._send(queued)
        except Exception as exc:  # a loop callback must not raise: its callers would wait forever
            log.exception("autopipe: could not send a batch")
            for _commands, future in queued:
                if not future.done():
                    future.set_exception(RedisConnectionError(f"could not send to redis: {exc!r}"))

    def _send(self, queued: list[tuple[Sequence[Command], asyncio.Future[list[Any]]]]) -> None:
        for start in range(0, len(queued), self.max_batch):
            batch = queued[start:start + self.max_batch]
            self.batches_sent += 1
            self.commands_sent += sum(len(c) for c, _ in batch)
            if self._wire is not None:
                self._wire.send(batch)
            else:
                assert self._tls is not None
                task = asyncio.create_task(_send_redis_py(self._tls, batch), name="autopipe:batch")
                self._batches.add(task)
                task.add_done_callback(self._batches.discard)

    async def aclose(self) -> None:
        if self._batches:
            await asyncio.gather(*self._batches, return_exceptions=True)
        if self._wire is not None:
            await self._wire.close()
        if self._tls is not None:
            await self._tls.aclose()


class _Wire:
    """One connection: writes as soon as a batch exists; replies matched in order as they are read.

    The connection's protocol (:class:`_WireProtocol`) parses what the socket gives and hands
    each reply to its caller in the very loop callback that read it. A reader task woken through
    a ``StreamReader`` would take one more loop turn per read, and when a burst keeps the loop
    busy a turn is milliseconds: the worker's job read and the hub's room read are such reads
    (docs/benchmarks.md). The reply timeout is a timer, armed while replies are awaited."""

    def __init__(self, kwargs: dict[str, Any], timeout_s: float) -> None:
        self.kwargs = kwargs
        self.timeout_s = timeout_s
        self.decode = bool(kwargs.get("decode_responses"))
        self._transport: asyncio.Transport | None = None
        self._connecting: asyncio.Task[None] | None = None
        self._waiters: deque[_Waiter] = deque()
        self._unsent: list[tuple[bytes, list[_Waiter]]] = []
        self._drained = asyncio.Event()
        self._progress = 0.0
        """Loop time of the last reply (or of the first command after a quiet spell)."""
        self._timer: asyncio.TimerHandle | None = None
        self._keeper: asyncio.Task[None] | None = None
        self._grace = False
        self.inflight = 0

    def send(self, batch: list[tuple[Sequence[Command], asyncio.Future[list[Any]]]]) -> None:
        waiters: list[_Waiter] = []
        blobs: list[bytes] = []
        for commands, future in batch:
            try:  # per group: one caller's unsendable argument fails that caller alone
                blobs.append(pack(commands))
            except DataError as exc:
                future.set_exception(exc)
                continue
            waiters.append((len(commands), [], future))
        if not waiters:
            return
        blob = b"".join(blobs)
        if self._connecting is not None or self._transport is None or self._transport.is_closing():
            # Connecting (or its handshake still out): sent once the connection is ready.
            self._unsent.append((blob, waiters))
            if self._connecting is None:
                self._connecting = asyncio.create_task(self._connect(), name="autopipe:connect")
            return
        self._write(blob, waiters)

    def _write(self, blob: bytes, waiters: list[_Waiter]) -> None:
        assert self._transport is not None
        if not self._waiters:
            self._progress = asyncio.get_running_loop().time()
            self._grace = False
        self._waiters.extend(waiters)
        self.inflight += sum(n for n, _, _ in waiters)
        self._drained.clear()
        self._transport.write(blob)
        if self._timer is None:
            self._arm(self.timeout_s)

    def _arm(self, delay_s: float) -> None:
        self._timer = asyncio.get_running_loop().call_later(delay_s, self._check)

    def _check(self) -> None:
        """The reply timer: fail everything in flight when nothing came for ``timeout_s`` and
        then for a grace period more. The grace is for a loop that was paused or blocked past the
        timeout: its replies are waiting in the socket, and the loop reads them before the grace
        ends (a libuv loop runs due timers before it polls the sockets)."""
        self._timer = None
        if not self._waiters:
            return
        transport = self._transport
        idle = asyncio.get_running_loop().time() - self._progress
        if idle < self.timeout_s:
            self._grace = False
            self._arm(self.timeout_s - idle)
        elif not self._grace:
            self._grace = True
            self._arm(GRACE_READ_S)
        elif transport is not None:
            self._lost(transport, RedisTimeoutError(f"no reply from redis in {self.timeout_s:.0f} s"))
            transport.abort()

    def _lost(self, transport: asyncio.BaseTransport, error: Exception) -> None:
        """``transport`` is gone (or given up on): every command in flight on it fails with
        ``error``; the next command reconnects."""
        if self._transport is not transport:
            return  # an older connection's late news: its waiters were failed already
        self._transport = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        waiters, self._waiters = self._waiters, deque()
        self.inflight = 0
        self._drained.set()
        for _, _, future in waiters:
            if not future.done():
                future.set_exception(error)

    async def _connect(self) -> None:
        transport: asyncio.Transport | None = None
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(self.kwargs.get("socket_connect_timeout") or
                                       min(self.timeout_s, CONNECT_TIMEOUT_S)):
                if self.kwargs.get("path"):
                    transport, _ = await loop.create_unix_connection(
                        lambda: _WireProtocol(self), self.kwargs["path"])
                else:
                    transport, _ = await loop.create_connection(
                        lambda: _WireProtocol(self), self.kwargs.get("host", "localhost"),
                        self.kwargs.get("port", 6379))
                hello: list[Command] = []
                if self.kwargs.get("password"):
                    user = self.kwargs.get("username")
                    hello.append(("AUTH", user, self.kwargs["password"]) if user else
                                 ("AUTH", self.kwargs["password"]))
                if self.kwargs.get("db"):
                    hello.append(("SELECT", int(self.kwargs["db"])))
                if hello:
                    # The handshake's replies are read as any others, before anything else is sent.
                    self._transport = transport
                    done: asyncio.Future[list[Any]] = loop.create_future()
                    self._write(pack(hello), [(len(hello), [], done)])
                    got = await done
                    for reply in got:
                        if isinstance(reply, Exception):
                            raise RedisConnectionError(f"redis refused the handshake: {reply}")
        except asyncio.CancelledError:  # closed while connecting
            if transport is not None:
                self._lost(transport, RedisConnectionError("connection to redis closed"))
                transport.close()
            raise
        except (OSError, TimeoutError, RedisConnectionError, RedisTimeoutError) as exc:
            if transport is not None:
                self._lost(transport, RedisConnectionError("handshake failed"))
                transport.close()
            self._connecting = None
            error = exc if isinstance(exc, RedisConnectionError) else RedisConnectionError(
                f"cannot connect to redis: {exc!r}")
            unsent, self._unsent = self._unsent, []
            for _, waiters in unsent:
                for _, _, future in waiters:
                    if not future.done():
                        future.set_exception(error)
            return
        self._transport = transport
        self._connecting = None
        protocol = transport.get_protocol()
        assert isinstance(protocol, _WireProtocol)
        self._keeper = asyncio.create_task(self._keep(transport, protocol), name="autopipe:connection")
        unsent, self._unsent = self._unsent, []
        for blob, waiters in unsent:
            self._write(blob, waiters)

    def _deliver(self, reply: Any) -> None:
        self._progress = asyncio.get_running_loop().time()
        self._grace = False
        expected, replies, future = self._waiters[0]
        replies.append(reply)
        self.inflight -= 1
        if len(replies) == expected:
            self._waiters.popleft()
            if not future.done():  # a caller cancelled meanwhile gets nothing
                future.set_result(replies)
            if not self._waiters:
                self._drained.set()

    async def drained(self) -> None:
        await self._drained.wait()

    async def _keep(self, transport: asyncio.Transport, protocol: _WireProtocol) -> None:
        """The connection's owner task. It does nothing while the connection lives (replies are
        handled by the protocol's callbacks); it exists so that a loop shutting down, which
        cancels its tasks, closes the socket, as the reader task of the stream version did: a
        pipeline nobody closed must not leave its socket to the garbage collector."""
        try:
            await protocol.closed
        finally:
            if not transport.is_closing():
                self._lost(transport, RedisConnectionError("connection to redis closed"))
                transport.close()

    async def close(self) -> None:
        if self._connecting is not None:
            self._connecting.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._connecting
        transport = self._transport
        if transport is not None:
            self._lost(transport, RedisConnectionError("connection to redis closed"))
            transport.close()
            protocol = transport.get_protocol()
            if isinstance(protocol, _WireProtocol):  # returns once the socket is closed
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self.timeout_s):
                        await protocol.closed


class _WireProtocol(asyncio.Protocol):
    """The socket side of a :class:`_Wire`: hiredis parses what arrives, each reply goes to its
    caller at once."""

    def __init__(self, wire: _Wire) -> None:
        self.wire = wire
        self.parser = (hiredis.Reader(replyError=ResponseError, encoding="utf-8") if wire.decode
                       else hiredis.Reader(replyError=ResponseError))
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        """Done once the connection is lost or closed."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # A stream transport (uvloop's does not subclass asyncio's classes: no isinstance here).
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        wire = self.wire
        try:
            self.parser.feed(data)
            while (reply := self.parser.gets()) is not False:
                if not wire._waiters:  # a reply nobody asked for: the stream is out of step
                    raise RedisConnectionError("redis sent a reply nobody waited for")
                wire._deliver(reply)
        except Exception as exc:  # garbage on the wire: nothing after it can be matched to a caller
            assert self.transport is not None
            wire._lost(self.transport, exc if isinstance(exc, RedisConnectionError) else
                       RedisConnectionError(f"unreadable reply from redis: {exc!r}"))
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        assert self.transport is not None
        if not self.closed.done():
            self.closed.set_result(None)
        self.wire._lost(self.transport, RedisConnectionError(
            f"connection to redis lost: {exc!r}" if exc is not None else "connection to redis closed"))


async def _send_redis_py(redis: Redis, batch: list[tuple[Sequence[Command], asyncio.Future[list[Any]]]]) -> None:
    pipe = redis.pipeline(transaction=False)
    for commands, _future in batch:
        for command in commands:
            pipe.execute_command(*command)
    try:
        replies = await pipe.execute(raise_on_error=False)
    except Exception as exc:
        for _commands, future in batch:
            if not future.done():
                future.set_exception(exc)
        return
    at = 0
    for commands, future in batch:
        if not future.done():
            future.set_result(replies[at:at + len(commands)])
        at += len(commands)
