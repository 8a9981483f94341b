"""Accepting a line on Redis Cluster: accept in the room's slot, then hand off to a job shard.

One Redis accepts and enqueues a line in one script (voxroom/store/single/ingress.py). A cluster cannot:
the room's keys and the job stream lie in different slots. So (docs/cluster.md, "Jobs without
a cross-slot write"), with the room's ``:utt`` log as the one source of truth:

1. **Accept** (the room's slot, atomic): the single instance's numbering, dedupe, back-pressure
   and voice switch (the same Lua, ``say.BODY``); the line goes to ``:utt`` with every field its
   job needs. The room's ``:state`` keeps ``shard`` (the job shard of all its lines), ``epoch``
   (set when ``:state`` is created: a room reborn after its keys expired is a new room to the
   shards) and ``handed`` (every line up to it is in its shard).
2. **Hand off** (the shard's slot, idempotent): ``XADD`` the job unless the shard's high-water
   mark for the room (``:handed``, ``epoch:seq``) says it has it, and move the mark, in one script.
3. **Record** ``handed`` in the room's ``:state`` (only forward, only for the same epoch).

Lines are handed in ``seq`` order and only after every earlier line of the room: a caller that
sees ``handed < seq - 1`` (another gateway's hand-off in flight, or lost) hands the gap first,
from ``:utt`` (:meth:`ClusterIngress.catch_up`). So the shard's mark only ever moves over a prefix of
the room's lines, and a line is added to its shard at most once however often it is handed.
A line lost between 1 and 2 (the gateway died, the shard's node was unreachable) is handed by
the room's next line or by the sweeper (voxroom/store/cluster/sweeper.py).

Before the accept, the room is written to its index shard (``vx:rooms:{rK}``), where the sweeper
looks: an accepted line's room is always in the index (an entry for a line then refused costs
nothing). A gateway rewrites an entry at most every :data:`INDEX_EVERY_S` per room.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from redis.exceptions import RedisClusterException, RedisError

from voxroom.store import cancels, keys, lines
from voxroom.store.cluster.jobs import SCRIPTS
from voxroom.store.cluster.pipeline import ClusterAutoPipeline
from voxroom.store.interface import CancelRequest, IngressOptions, SayOutcome
from voxroom.store.lua import handoff, say
from voxroom.store.replicas import check_wait, wait_replicas
from voxroom.voices import line_lexicon

log = logging.getLogger("voxroom.gateway.handoff")

INDEX_EVERY_S = 10.0
"""How often one gateway rewrites a room's index entry while the room is busy (the sweeper looks
at rooms active in the last :data:`voxroom.store.cluster.sweeper.ACTIVE_WINDOW_S`, minutes)."""
_INDEXED_MAX = 10_000

@dataclass(frozen=True, slots=True)
class Line:
    """One accepted line as the room's ``:utt`` holds it: what its job is made of."""
    seq: int
    fields: list[str]
    """Field pairs (``seq``, ``text``, ``voice``...), flat."""

    def time_ms(self) -> float:
        pairs = dict(zip(self.fields[::2], self.fields[1::2], strict=True))
        return float(pairs.get("time", 0))


class ShardGap(Exception):
    """The room's job shard holds its lines up to :attr:`held` only, below the line being handed:
    a failover of the shard's primary lost hand-offs the room's ``:state`` recorded."""

    def __init__(self, held: int) -> None:
        super().__init__(f"the shard holds the room's lines up to {held}")
        self.held = held


@dataclass(frozen=True, slots=True)
class RoomMark:
    """Where a room's hand-off stands (from its ``:state``)."""
    epoch: str
    handed: int
    shard: int
    next: int = 1
    """The room's turn: the line it plays (or waits for) now (read by :meth:`ClusterIngress.mark`)."""


class ClusterIngress:
    """:class:`voxroom.store.interface.Ingress` on a cluster. ``calls`` (owned: closed by
    :meth:`aclose`): the gateway's autopipeline, one connection per node (``WAIT`` must go out on
    the connection of the accept). ``shards``: the deployment's ``job_shards`` (every gateway and
    worker the same). Raises ``ValueError`` for ``WAIT`` options :func:`check_wait` refuses."""

    def __init__(self, calls: ClusterAutoPipeline, options: IngressOptions, *, shards: int) -> None:
        if shards < 1:
            raise ValueError(f"job_shards must be at least 1, not {shards}")
        check_wait(options.wait_replicas, options.wait_timeout_ms, calls.timeout_s)
        self.options = options
        self.wait_replicas = options.wait_replicas
        self.wait_timeout_ms = options.wait_timeout_ms
        self.room_idle_ttl_s = options.room_idle_ttl_s
        self.calls = calls
        self.shards = shards
        self.jobs_maxlen = options.jobs_maxlen
        self._indexed: dict[str, float] = {}
        self.handed = 0
        """Jobs this gateway added to a shard (a hand-off the shard already had is not counted)."""

    async def aclose(self) -> None:
        await self.calls.aclose()

    async def say(self, room: str, sender: str, client_seq: int, text: str, voice: str, *,
                  lexicon: Mapping[str, str] | None = None, to: Sequence[str] = (),
                  open_line: bool = False) -> SayOutcome:
        o = self.options
        now_ms = int(time.time() * 1000)
        # say.SINGLE's ARGV; the cluster's script reads 7 and 11 as the epoch and the shard.
        return await self.say_and_hand(room, [
            sender, client_seq, text, voice, now_ms, o.utterance_maxlen, o.jobs_maxlen, room, o.max_pending_per_room,
            o.room_idle_ttl_s, 0, 0, o.switch_lines, line_lexicon.encode(lexicon or {}), " ".join(to),
            "1" if open_line else "", len(text)])

    async def cancel(self, room: str, request: CancelRequest) -> list[int]:
        return await cancels.cancel(self.calls, SCRIPTS.cancel, room, request)

    async def append(self, room: str, sender: str, client_seq: int, part: int, text: str, *,
                     final: bool) -> int:
        return await lines.append(self.calls, SCRIPTS.append, room, sender, client_seq, part, text, final=final,
                                  ttl_s=self.options.room_idle_ttl_s)

    async def flush(self, room: str, sender: str, client_seq: int) -> int:
        return await lines.flush(self.calls, SCRIPTS.flush, room, sender, client_seq,
                                 ttl_s=self.options.room_idle_ttl_s)

    # -- step 0: the index the sweeper reads -----------------------------------------------------

    async def index(self, room: str, now_ms: int) -> None:
        now = time.monotonic()
        last = self._indexed.get(room)
        if last is not None and now - last < INDEX_EVERY_S:
            return
        if len(self._indexed) >= _INDEXED_MAX:
            self._indexed.clear()  # forgetting costs one ZADD per room
        await self.calls.call("ZADD", keys.rooms_shard(keys.shard_of(room, self.shards), self.shards), now_ms, room)
        self._indexed[room] = now

    # -- step 1 ----------------------------------------------------------------------------------

    async def accept(self, room: str, argv: list[Any]) -> tuple[SayOutcome, RoomMark | None, Line | None]:
        """Accept a line (``argv``: ``say.SINGLE``'s ARGV, 17 values). The mark and the line are
        ``None`` unless accepted."""
        now_ms = int(argv[4])
        await self.index(room, now_ms)
        argv = list(argv)
        argv[6] = f"{now_ms}-{secrets.token_hex(4)}"
        argv[10] = keys.shard_of(room, self.shards)
        argv[11] = ""
        reply: Any = await self.calls.call(
            "EVAL", say.CLUSTER, 6, keys.room_senders(room), keys.room_seq(room), keys.room_utterances(room),
            keys.room_output(room), keys.room_state(room), keys.open_line(room, str(argv[0]), int(argv[1])), *argv)
        status = int(reply[0])
        if status != 1:
            kind: Literal["duplicate", "busy", "too_old"] = (
                "duplicate" if status == 0 else "too_old" if status == -2 else "busy")
            return SayOutcome(kind, int(reply[1])), None, None
        seq = int(reply[1])
        mark = RoomMark(str(reply[2]), int(reply[3]), int(reply[4]))
        return SayOutcome("accepted", seq), mark, Line(seq, [str(v) for v in reply[5:]])

    async def say_and_hand(self, room: str, argv: list[Any]) -> SayOutcome:
        """Accept, then hand off. The line is accepted once step 1 answered: a hand-off that
        fails (Redis unavailable) is logged and left to the room's next line or the sweeper.
        With ``wait_replicas``, the replicas' ``WAIT`` runs beside the hand-off (it holds the
        room node's connection, not the shard's); :class:`voxroom.errors.NotReplicated` when they
        did not confirm in time, raised after the hand-off: the line is in the primary's
        ``:utt`` and is handed and spoken like any other, only the answer differs."""
        outcome, mark, line = await self.accept(room, argv)
        if not self.wait_replicas:
            if mark is not None and line is not None:
                await self._hand_off(room, mark, line)
            return outcome
        steps: list[Coroutine[Any, Any, None]] = []
        if mark is not None and line is not None:
            steps.append(self._hand_off(room, mark, line))
        steps.append(self._wait(room, outcome))
        # Both run to their end before anything is raised: no step is left running unawaited.
        for result in await asyncio.gather(*steps, return_exceptions=True):
            if isinstance(result, BaseException):
                raise result
        return outcome

    async def _wait(self, room: str, outcome: SayOutcome) -> None:
        """``WAIT`` on the pipeline of the node that holds the room: the one connection the accept
        went out on. The cluster autopipeline would route ``WAIT`` (no key) by its first argument,
        so the node is found from the room's key here. A slot moving between the accept and the
        ``WAIT`` (the accept followed an ``ASK`` during a migration) leaves the ``WAIT`` on the old
        node, where it counts that connection's writes, not the line's: a window of the kind a lost
        connection opens (voxroom/store/replicas.py, :func:`~voxroom.store.replicas.wait_replicas`)."""
        pipe = await self.calls.pipe_for(keys.room_utterances(room))
        await wait_replicas(pipe, room, outcome, replicas=self.wait_replicas, timeout_ms=self.wait_timeout_ms,
                            room_ttl_s=self.room_idle_ttl_s)

    async def _hand_off(self, room: str, mark: RoomMark, line: Line) -> None:
        try:
            if mark.handed == line.seq - 1:
                try:
                    await self.hand(room, mark, line)
                except ShardGap as gap:
                    await self._hand_again(room, mark, gap.held, line.seq)
                    return
                await self.record(room, mark, line.seq)
            else:
                await self.catch_up(room, mark, line.seq)
        except (RedisError, RedisClusterException) as exc:
            # Whatever went wrong after the accept (Redis unavailable, a slot moving), the line is
            # accepted: the room's :utt has it, and it will be handed from there.
            log.warning("room %s line %d accepted, hand-off to shard %d left to the sweeper: %s", room,
                        line.seq, mark.shard, exc)

    # -- steps 2 and 3 ---------------------------------------------------------------------------

    async def hand(self, room: str, mark: RoomMark, line: Line, *, floor: int | None = None) -> bool:
        """Add ``line``'s job to the room's shard unless the shard has it. ``True``: added now.
        ``floor``: the lines at or below it need not be in the shard (they played; by default
        those below the room's turn). Raises :class:`ShardGap` when the shard lacks lines between
        the floor and this one (lost in a failover of its primary)."""
        shard = mark.shard
        added = int(await self.calls.call(
            "EVAL", handoff.HAND, 3, keys.job_shard(shard, self.shards), keys.job_shard_handed(shard, self.shards),
            keys.job_shard_handed_at(shard, self.shards), room, line.seq, mark.epoch, self.jobs_maxlen,
            int(time.time() * 1000), mark.next - 1 if floor is None else floor, *line.fields))
        if added < 0:
            raise ShardGap(-1 - added)
        if added:
            self.handed += 1
        return bool(added)

    async def record(self, room: str, mark: RoomMark, seq: int) -> None:
        """Every line of the room up to ``seq`` is in its shard."""
        await self.calls.call("EVAL", handoff.RECORD, 1, keys.room_state(room), seq, mark.epoch)

    async def mark(self, room: str) -> tuple[int, RoomMark | None]:
        """The room's last seq and its hand-off mark (``None``: no ``:state`` epoch, a room
        from a single-instance gateway or one whose ``:state`` expired)."""
        seq, (epoch, handed, shard, turn) = await asyncio.gather(
            self.calls.call("GET", keys.room_seq(room)),
            self.calls.call("HMGET", keys.room_state(room), "epoch", "handed", "shard", "next"))
        if epoch is None or shard is None:
            return int(seq or 0), None
        return int(seq or 0), RoomMark(str(epoch), int(handed or 0), int(shard), int(turn or 1))

    async def shard_mark(self, room: str, mark: RoomMark) -> int:
        """The last line of ``room`` its job shard holds by the shard's own high-water mark (0:
        none of this epoch). Below ``mark.handed`` only when the shard lost jobs its room recorded
        as handed: a failover of the shard's primary, when it is not the room's (the replica
        promoted had not received the last hand-offs, the room's primary had their records)."""
        held = await self.calls.call("HGET", keys.job_shard_handed(mark.shard, self.shards), room)
        if held is None:
            return 0
        epoch, _, seq = str(held).rpartition(":")
        return int(seq) if epoch == mark.epoch else 0

    async def catch_up(self, room: str, mark: RoomMark, upto: int, *, older_than_ms: float | None = None) -> int:
        """Hand every line of ``room`` with ``mark.handed < seq <= upto``, in order, from ``:utt``,
        recording ``handed`` after each. ``older_than_ms``: stop at the first line accepted after
        that time (the sweeper leaves young lines to the gateway accepting them). A line missing
        from ``:utt`` (trimmed, or lost in a failover) can never come back: it is passed over, and
        the worker's turn wait skips it. Returns the lines now known to be in the shard."""
        try:
            return await self._hand_in_order(room, mark, mark.handed, upto, older_than_ms)
        except ShardGap as gap:
            return await self._hand_again(room, mark, gap.held, upto, older_than_ms)

    async def _hand_again(self, room: str, mark: RoomMark, held: int, upto: int,
                          older_than_ms: float | None = None) -> int:
        """The shard holds the room's lines up to ``held`` only: hand every later line the room
        has not played yet, up to ``upto``, again."""
        _, fresh = await self.mark(room)
        floor = max(held, (fresh or mark).next - 1)
        log.warning("room %s: job shard %d holds its lines up to %d only (hand-offs lost in a failover); "
                    "handing %d to %d again", room, mark.shard, held, floor + 1, upto)
        return await self._hand_in_order(room, mark, floor, upto, older_than_ms)

    async def _hand_in_order(self, room: str, mark: RoomMark, after: int, upto: int,
                             older_than_ms: float | None) -> int:
        if upto <= after:
            return 0
        lines = await self.lines_after(room, after, upto)
        done = 0
        for line in lines:
            if older_than_ms is not None and line.time_ms() > older_than_ms:
                break
            await self.hand(room, mark, line, floor=after)
            await self.record(room, mark, line.seq)
            done += 1
        else:
            if not lines or lines[-1].seq < upto:
                await self.record(room, mark, upto)  # the last lines are gone from :utt
        return done

    async def lines_after(self, room: str, after: int, upto: int) -> list[Line]:
        """The lines of ``:utt`` with ``after < seq <= upto``, in seq order."""
        entries: Any = await self.calls.call("XREVRANGE", keys.room_utterances(room), "+", "-",
                                             "COUNT", upto - after + 8)
        lines = []
        for _entry_id, fields in entries:
            flat = _flat(fields)
            pairs = dict(zip(flat[::2], flat[1::2], strict=True))
            seq = int(pairs.get("seq", 0))
            if after < seq <= upto:
                lines.append(Line(seq, flat))
        lines.sort(key=lambda line: line.seq)
        return lines


def _flat(fields: Any) -> list[str]:
    """A stream entry's fields as flat pairs, whatever shape the client gave them."""
    if isinstance(fields, dict):
        out: list[str] = []
        for name, value in fields.items():
            out += [str(name), str(value)]
        return out
    return [str(v) for v in fields]
