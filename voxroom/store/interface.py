"""What the layers above ask of Redis, as typed interfaces. The gateway, the worker and the CLI
hold these, never a Redis client: which Redis mode serves them (one instance, or a Redis Cluster)
is decided once, where the store is opened (``voxroom/store/opening.py``), and each interface has
one implementation per mode, in sibling folders with mirrored file names::

    voxroom/store/single/   store.py ingress.py fanout.py watcher.py jobs.py
    voxroom/store/cluster/  store.py ingress.py fanout.py watcher.py jobs.py
                            + sweeper.py bells.py pipeline.py calls.py slots.py (Cluster-only parts)

What is written once, over :class:`Commands` (one ``AutoPipeline``, or one per node on a
cluster): the client-id claims (``claims.py``), the worker's job bus around the mode's job queue
(``jobs.py``), the scripts (``lua/``), the key names (``keys.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple, Protocol

from voxroom.runtime.supervisor import Supervisor
from voxroom.store.lua.room import RoomScripts
from voxroom.wire.jobs import Job

Command = Sequence[Any]
"""A command as Redis reads it: ``("XADD", key, "MAXLEN", "~", 3000, "*", "field", value)``."""


class Commands(Protocol):
    """Commands through an automatic pipeline (``voxroom/store/autopipe.py``): everything issued
    in one loop turn leaves together; on a cluster each command goes to its key's node. Replies are
    raw RESP2 (``HGETALL`` a flat list); error replies raise redis-py's classes (``-LOADING`` a
    ``BusyLoadingError``...), so ``REDIS_DOWN`` catches "Redis cannot serve us now"."""

    async def call(self, *command: Any) -> Any: ...

    async def group(self, commands: Sequence[Command]) -> list[Any]:
        """In order (per node on a cluster), not atomic; the first error reply raised after all ran."""
        ...

    async def replies(self, commands: Sequence[Command]) -> list[Any]:
        """As :meth:`group`, with error replies returned in place instead of raised (a lost
        connection still raises)."""
        ...

    async def capacity(self) -> None:
        """Wait while the pipeline has its most commands unanswered (before :meth:`submit`)."""
        ...

    def submit(self, commands: Sequence[Command]) -> asyncio.Future[list[Any]]:
        """For a loop callback that cannot await: the future of the replies, error replies in
        place (the caller bounds what it submits, see :meth:`capacity`)."""
        ...

    def flush(self) -> None:
        """Send what is queued now instead of at the end of this loop turn."""
        ...

    async def aclose(self) -> None: ...


# -- the gateway -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SayOutcome:
    status: Literal["accepted", "duplicate", "busy", "too_old"]
    utterance: int
    """The room seq given (accepted), the last client seq seen (duplicate, too_old: a seq more than
    ``say.GAPS_KEPT`` below it, which nobody can tell stored or not), or the backlog (busy)."""


@dataclass(frozen=True, slots=True)
class IngressOptions:
    """How lines are accepted (the settings of the same names, ``voxroom/runtime/settings.py``)."""

    utterance_maxlen: int = 1000
    jobs_maxlen: int = 100_000
    max_pending_per_room: int = 16
    room_idle_ttl_s: int = 3600
    """A room's keys expire this long after its last accepted line."""
    switch_lines: int = 3
    """Lines a voice switch is spread over (1: within the line that makes it)."""
    wait_replicas: int = 0
    """Answer ``accepted`` (and ``duplicate``) only once that many replicas confirmed the write."""
    wait_timeout_ms: int = 500

    def __post_init__(self) -> None:
        if self.room_idle_ttl_s < 1:
            raise ValueError(f"room_idle_ttl_s must be at least 1 s, not {self.room_idle_ttl_s}")
        if self.switch_lines < 1:
            raise ValueError(f"switch_lines must be at least 1, not {self.switch_lines}")


class Ingress(Protocol):
    """Stores lines: dedupe by (sender, client seq), back-pressure, the room's next number, the
    voice switch, the job for the workers. Raises one of ``REDIS_DOWN`` when nothing could be
    stored (the client resends the same seq), :class:`voxroom.errors.NotReplicated` when the line
    is in the primary but its replicas did not confirm it."""

    async def say(self, room: str, sender: str, client_seq: int, text: str, voice: str, *,
                  lexicon: Mapping[str, str] | None = None, to: Sequence[str] = (),
                  open_line: bool = False) -> SayOutcome:
        """Store a line (``to``: a private line's audience, client ids; empty: the whole room;
        ``open_line``: more text follows in :meth:`append` parts)."""
        ...

    async def cancel(self, room: str, request: CancelRequest) -> list[int]:
        """Cancel lines of ``room`` not yet finished: the room numbers cancelled (already
        cancelled ones again: a cancel is idempotent). Written to Redis before it returns, so a
        worker that claims the line later sees it cancelled. Raises
        :class:`voxroom.errors.CancelRefused` (``not_found``, ``forbidden``), or one of ``REDIS_DOWN``."""
        ...

    async def append(self, room: str, sender: str, client_seq: int, part: int, text: str, *,
                     final: bool) -> int:
        """Store part ``part`` of ``sender``'s open line ``client_seq`` (voxroom/store/lines.py);
        its offset in the line's text. Raises :class:`voxroom.errors.LineRefused`, or one of
        ``REDIS_DOWN``."""
        ...

    async def flush(self, room: str, sender: str, client_seq: int) -> int:
        """Ask for the open line to be spoken through what it holds; the last part it holds.
        Raises :class:`voxroom.errors.LineRefused`, or one of ``REDIS_DOWN``."""
        ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class CancelRequest:
    """What a ``cancel`` names (voxroom/wire/protocol.py ``Cancel``) and who asks."""
    what: Literal["utterance", "seq", "all"]
    number: int | None
    """The room number (``utterance``) or the canceller's say seq (``seq``); ``None`` for ``all``."""
    client_id: str
    host: bool
    """May cancel any line of the room, not only the canceller's own."""


class FanoutEvents(Protocol):
    """What a fan-out source tells the hub that owns it (app/fanout/hub.py). Called from the
    source's loops, synchronously: none of these may await."""

    def deliver(self, room: str, entries: list[Any]) -> None:
        """A room's new output entries, raw (``[[id, [field, value, ...]], ...]``), in order; called
        with the room's cursor already moved past them and nothing awaited since, so a caller
        comparing a position with :meth:`FanoutSource.cursor` sees a consistent pair."""
        ...

    def pulse(self) -> None:
        """A batch of reads was delivered (catch-ups waiting for a cursor to move look again)."""
        ...

    def resync(self, room: str, cursor: str) -> None:
        """The room's reads were cut off (Redis unreachable from here) and are back: what comes
        next after ``cursor`` (the last entry delivered) may be a backlog, not live audio. Called
        before it is delivered: the hub turns the room's live clients into catching-up ones from
        ``cursor``, paced to what each drains, as resuming clients are."""
        ...

    def unreachable(self, error: BaseException) -> None:
        """The source's reads fail: Redis cannot be reached from here (called at every failure)."""
        ...

    def reachable(self) -> None:
        """A read succeeded (called after every successful read: cheap)."""
        ...


class FanoutSource(Protocol):
    """The gateway hub's reads of its rooms' output streams: each entry after a room's cursor is
    delivered once, in order, for as long as the room is held. Its loops run under the supervisor
    it was made with (``/readyz`` reports them)."""

    def cursor(self, room: str) -> str | None:
        """The id of the last entry delivered for ``room`` (or its tail when added); ``None``
        when not held."""
        ...

    async def add(self, room: str, cursor: str) -> None:
        """Start reading ``room`` after ``cursor``. Never raises for an unavailable Redis: the
        reads catch up when it is back."""
        ...

    async def remove(self, room: str) -> None:
        """Stop reading ``room``; nothing more of it is delivered."""
        ...

    async def aclose(self) -> None: ...


class StreamWatch(Protocol):
    """Waits for a room's output stream to move, for many waiters at once without a connection
    each (a worker's lines waiting for their turn; the speech API's responses)."""

    async def wait(self, room: str, after_id: str, timeout_s: float) -> str:
        """Return once the room's output stream has an entry after ``after_id`` (the newest id
        seen), or ``after_id`` after ``timeout_s`` (also while Redis is unavailable)."""
        ...

    async def run(self) -> None:
        """The watcher's loop, for its process's supervisor."""
        ...

    async def aclose(self) -> None: ...


class Layout(Protocol):
    """Where the keys that are not a room's own lie: one ``vx:rooms`` and one ``vx:jobs``, or a
    cluster's shards of them (``VOXROOM_JOB_SHARDS``)."""

    def room_index(self, room: str) -> str:
        """The listing index (zset) that holds ``room``."""
        ...

    def room_indexes(self) -> list[str]: ...

    def job_streams(self) -> list[str]: ...

    def job_stream_of(self, room: str) -> str:
        """The job stream that holds ``room``'s jobs."""
        ...


# -- the worker ------------------------------------------------------------------------------------


class Turn(NamedTuple):
    next: int
    """The seq allowed to play next."""
    end_ms: float
    """Room-clock time where the room's audio ends."""
    started: int
    """The last seq whose start was published: ``started == next`` means that utterance began once
    already (its worker died) and must be restarted, not continued."""
    opus_wanted: bool
    cancelled: frozenset[int] = frozenset()
    """The room's lines cancelled and not yet ended or passed (``:state`` ``cancelled``)."""


class Fence(NamedTuple):
    """What a write for one job is checked against (``voxroom/store/lua/room.py``)."""
    key: str
    """``KEYS[1]`` of the room scripts: the job stream on one Redis, a key of the room's slot on a cluster."""
    a: str
    b: str


class JobQueue(Protocol):
    """The job stream(s) a worker reads, and what a job's writes are fenced by. One Redis: one
    ``vx:jobs`` and its pending list; a cluster: job shards and an owner field in the room's slot."""

    scripts: RoomScripts
    """The room scripts with this mode's fence."""

    async def ensure_groups(self) -> None: ...

    async def read(self, count: int, block_ms: int) -> list[Job]:
        """New jobs for this consumer, at most ``count``; waits up to ``block_ms`` for the first."""
        ...

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Job]:
        """Jobs left pending by a consumer that went quiet (a dead worker), now ours."""
        ...

    async def touch(self, entry_ids: list[str]) -> list[str]:
        """Reset the idle time of the jobs we still own; returns the ids no longer ours."""
        ...

    def fence(self, job: Job) -> Fence | None:
        """``None``: the job is not ours (a cluster has no token for it)."""
        ...

    async def done(self, job: Job) -> bool:
        """After a room script ran ``done`` for ``job``: whatever else acking it takes (a
        cluster's ``XACK`` on the shard). ``False``: it was no longer ours there."""
        ...

    def forget(self, entry_id: str) -> None:
        """Nothing more will be written for this job by this worker (it was refused as not ours)."""
        ...

    async def drop(self, entry_id: str) -> None:
        """Ack an entry that cannot become a job of ours (trimmed, malformed, a duplicate)."""
        ...

    async def aclose(self) -> None: ...


class JobBus(Protocol):
    """The worker's job bus (voxroom/store/jobs.py): take jobs, keep them claimed, publish their
    audio fenced, keep the room's order. Every write raises :class:`voxroom.errors.OwnershipLost`
    when the job is no longer this worker's, :class:`voxroom.errors.TurnLost` when the room's turn
    moved past it; every method raises one of ``REDIS_DOWN`` when Redis cannot serve it."""

    @property
    def watcher(self) -> StreamWatch:
        """The worker's one turn watcher (its owner runs ``watcher.run`` under its supervisor)."""
        ...

    async def ensure_group(self) -> None: ...

    async def read_jobs(self, count: int, block_ms: int) -> list[Job]:
        """New jobs for this consumer, at most ``count``; waits up to ``block_ms`` for the first."""
        ...

    async def claim_stale(self, min_idle_ms: int, count: int) -> list[Job]: ...

    async def touch(self, entry_ids: list[str]) -> list[str]:
        """Reset the idle time of jobs still ours; the ids that are not (the caller drops them)."""
        ...

    async def ack(self, job: Job) -> bool: ...

    async def skip_to(self, job: Job) -> None: ...

    async def room_turn(self, room: str) -> Turn: ...

    async def output_tail(self, room: str) -> str: ...

    async def published_slices(self, room: str, seq: int) -> int: ...

    async def wait_output(self, room: str, after_id: str, block_ms: int) -> str: ...

    async def read_pieces(self, job: Job, after_id: str, count: int) -> list[tuple[str, dict[str, str]]]:
        """An open line's pieces after ``after_id`` (``0-0``: from its first), at most ``count``:
        ``(entry id, fields)`` (voxroom/store/lua/lines.py says what the fields are)."""
        ...

    async def close_idle_line(self, job: Job, last_id: str) -> bool:
        """Close ``job``'s open line as if its sender had sent ``final``, unless a piece came after
        ``last_id``; whether it closed it."""
        ...

    async def drop_line(self, job: Job) -> None:
        """Delete ``job``'s open line's pieces (the line ended)."""
        ...

    async def publish(self, job: Job, entries: list[dict[Any, Any]], *, started: int | None = None,
                      final: bool = False) -> None: ...

    async def finish(self, job: Job, end_fields: dict[str, Any], end_ms: float, *, cut: bool = False) -> None: ...

    async def pass_turn(self, job: Job) -> None: ...

    async def heartbeat(self, worker_id: str, fields: dict[Any, Any], ttl_s: int, now_ms: int) -> None: ...

    async def drop_heartbeat(self, worker_id: str) -> None: ...

    async def close(self) -> None: ...


SAY_HOLD_S = 0.0005
"""The longest a ``say`` waits in its loop turn for later ones to share its write (both modes'
ingress). A burst of 100 rooms' lines takes the gateway several milliseconds to handle in one
turn; held to the turn's end they reached Redis's job stream 2 to 5 ms later at the median
(docs/benchmarks.md, "The burst again")."""


# -- the store -------------------------------------------------------------------------------------

Loop = Callable[[], Coroutine[Any, Any, None]]


class Store(Protocol):
    """One Redis deployment, opened once per process (``voxroom.store.open_store``)."""

    url: str

    @property
    def layout(self) -> Layout: ...

    def commands(self, *, decode: bool = True, timeout_s: float = 5.0,
                 max_hold_s: float | None = None) -> Commands:
        """A new automatic pipeline (its own connection, one per node on a cluster); the caller
        closes it. ``decode``: text replies (``False`` for audio); ``timeout_s``: the longest
        reply wait (longer for a blocked read); ``max_hold_s``: see ``AutoPipeline``."""
        ...

    def slot_of(self, key: str) -> int:
        """Keys of one slot may share a script (0 for every key on one Redis)."""
        ...

    async def ping(self) -> None:
        """Raises one of ``REDIS_DOWN`` when Redis does not answer."""
        ...

    def ingress(self, options: IngressOptions) -> Ingress: ...

    def fanout(self, control: Commands, supervisor: Supervisor, gateway_id: str, events: FanoutEvents, *,
               rooms_per_reader: int = 200) -> FanoutSource:
        """``control``: the hub's own pipeline (bytes replies), for wakes and reads that do not
        block; ``events``: the hub, told what was read and when reads fail."""
        ...

    def watcher(self, wake_key: str, control: Commands) -> StreamWatch:
        """``wake_key``: the process's private wake stream (``keys.gateway_wake``,
        ``keys.worker_wake``), written through ``control``."""
        ...

    def gateway_loops(self, gateway_id: str, *, room_idle_ttl_s: int) -> dict[str, Loop]:
        """The store's own background loops on a gateway, by name (a cluster's hand-off sweeper)."""
        ...

    def job_bus(self, consumer: str, *, resume_window_ms: int = 120_000, room_idle_ttl_s: int = 3600) -> JobBus:
        """The worker ``consumer``'s job bus (voxroom/store/jobs.py) over this mode's job queue,
        with its turn watcher (``bus.watcher``: its owner runs ``bus.watcher.run`` under a
        supervisor; :meth:`JobBus.close` closes everything the bus holds)."""
        ...

    async def aclose(self) -> None: ...
