"""The gateway's hand-off sweeper (Redis Cluster only): lines accepted but never handed to their
job shard are handed from the room's ``:utt`` (docs/cluster.md, "Jobs without a cross-slot write").

A hand-off is lost when the gateway that accepted a line dies between the accept and the
hand-off, or the shard's node did not answer then. The room's next line hands the gap itself
(voxroom/store/cluster/ingress.py); this loop covers a room that says nothing more. Every :data:`SWEEP_EVERY_S`
it reads each room index shard (``vx:rooms:{rK}``) for the rooms active in the last
:data:`ACTIVE_WINDOW_S`, and for each compares ``:seq`` with ``handed`` in ``:state``. A room
behind is swept under a lease in its own slot (``vx:room:{R}:sweep``, ``SET NX PX``), so two
gateways do not both sweep it (both would be harmless, the hand-off being idempotent, only
wasteful). Lines younger than :data:`GRACE_MS` are left to the gateway accepting them.

A failover can also lose jobs the room records as handed: the room's ``:state`` and its job shard
lie on different primaries after a reshard or with another slot layout (keys.shard_tag puts a
shard with its rooms where it can), and the shard's promoted replica had not received the last
hand-offs. The room then waits for a line no worker will ever read, and after ``order_wait_ms``
(30 s) skips it. So a room whose turn (``next``) has not moved for :data:`STUCK_S` while handed
lines wait has its shard's high-water mark read, and the lines the shard lacks are handed again
(the hand-off is idempotent: a line the shard has is not added twice).

The same pass keeps the shards small: index entries older than the room TTL are removed, and
so are the job shards' high-water marks of rooms with no hand-off for that long.

Owned by the gateway's supervisor as ``gateway:sweeper`` (it restarts it and ``/readyz`` says
when it is down); Redis unavailable is a pass skipped, never a crash.
"""

from __future__ import annotations

import asyncio
import logging
import time

from redis.exceptions import MovedError, RedisClusterException

from voxroom.store import keys
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.cluster.ingress import ClusterIngress, RoomMark
from voxroom.store.lua import claims, handoff

log = logging.getLogger("voxroom.gateway.sweeper")

SWEEP_EVERY_S = 1.0
ACTIVE_WINDOW_S = 300
"""Rooms whose index entry is older are not looked at: their lines were handed, or their
gateways were all down longer than this (then the room's next line hands the gap)."""
GRACE_MS = 2000
LEASE_MS = 10_000
ROOMS_PER_SHARD = 2000
"""Rooms of one index shard looked at per pass at most (the newest first)."""
STUCK_S = 3.0
"""A room whose turn stayed put this long with handed lines waiting has its shard checked."""
PRUNE_PER_PASS = 64
CONCURRENT_ROOMS = 16
_SKIP_PASS: tuple[type[BaseException], ...] = (*REDIS_DOWN, MovedError, RedisClusterException)
"""Redis unavailable, or a slot moving (a ``MOVED`` twice in a row): the next pass tries again."""

class Sweeper:
    def __init__(self, ingress: ClusterIngress, holder: str, *, room_idle_ttl_s: int = 3600,
                 every_s: float = SWEEP_EVERY_S, grace_ms: int = GRACE_MS, stuck_s: float = STUCK_S) -> None:
        """``holder``: this gateway's id (the value of the leases it takes)."""
        self.stuck_s = stuck_s
        self.ingress = ingress
        self.holder = holder
        self.room_idle_ttl_s = room_idle_ttl_s
        self.every_s = every_s
        self.grace_ms = grace_ms
        self.swept = 0
        """Lines this sweeper handed (or found already in their shard) after their gateway did not."""
        self._turns: dict[str, tuple[int, float]] = {}
        """Room -> (its turn, when this sweeper first saw it there): bounded by the rooms a pass
        looks at (those not looked at in a pass are forgotten)."""

    async def run(self) -> None:
        while True:
            try:
                await self.sweep_once()
            except _SKIP_PASS as exc:
                log.warning("hand-off sweep skipped: redis unavailable (%s)", exc)
            await asyncio.sleep(self.every_s)

    async def sweep_once(self, *, grace_ms: int | None = None) -> int:
        """One pass over every index shard; returns the lines handed. ``grace_ms``: this pass's
        grace (tests pass 0)."""
        now_ms = int(time.time() * 1000)
        grace = self.grace_ms if grace_ms is None else grace_ms
        shards = self.ingress.shards
        # Every index shard and every room on its own: one primary down (its shards, its rooms)
        # must not hold up the sweep of the rooms on the others.
        found = await asyncio.gather(*(self._index_shard(shard, now_ms) for shard in range(shards)),
                                     return_exceptions=True)
        rooms = [room for got in found if isinstance(got, list) for room in got]
        skipped = [got for got in found if isinstance(got, BaseException)]
        limit = asyncio.Semaphore(CONCURRENT_ROOMS)

        async def one(room: str) -> int | BaseException:
            async with limit:
                try:
                    return await self.sweep_room(room, older_than_ms=now_ms - grace)
                except _SKIP_PASS as exc:
                    return exc

        looked = set(rooms)
        self._turns = {room: seen for room, seen in self._turns.items() if room in looked}
        results = await asyncio.gather(*(one(room) for room in rooms))
        skipped += [r for r in results if isinstance(r, BaseException)]
        handed = sum(r for r in results if isinstance(r, int))
        if skipped and not rooms and len(skipped) >= shards:
            raise skipped[0]  # nothing could be read at all: the pass is skipped (logged by run)
        for error in skipped[:1]:
            log.debug("hand-off sweep: %d shards or rooms left for the next pass (%s)", len(skipped), error)
        self.swept += handed
        return handed

    async def _index_shard(self, shard: int, now_ms: int) -> list[str]:
        """The rooms of index shard ``shard`` active lately; its stale entries and its job shard's
        stale high-water marks go. Raises what Redis raises for that shard alone."""
        calls, shards = self.ingress.calls, self.ingress.shards
        index = keys.rooms_shard(shard, shards)
        found = await calls.call("ZREVRANGEBYSCORE", index, "+inf", now_ms - ACTIVE_WINDOW_S * 1000,
                                 "LIMIT", 0, ROOMS_PER_SHARD)
        cutoff = now_ms - self.room_idle_ttl_s * 1000
        await calls.call("ZREMRANGEBYSCORE", index, "-inf", f"({cutoff}")
        await calls.call("EVAL", handoff.PRUNE, 2, keys.job_shard_handed(shard, shards),
                         keys.job_shard_handed_at(shard, shards), cutoff, PRUNE_PER_PASS)
        return [str(room) for room in found]

    async def sweep_room(self, room: str, *, older_than_ms: float) -> int:
        """Hand the room's lines past ``handed`` (accepted before ``older_than_ms``), under the
        room's lease; 0 when it is not behind or another gateway holds the lease."""
        seq, mark = await self.ingress.mark(room)
        if mark is None:
            return 0
        if seq <= mark.handed:
            if not self._stuck(room, mark):
                return 0
            held = await self.ingress.shard_mark(room, mark)
            if held >= mark.handed:
                return 0
            log.warning("room %s: job shard %d holds its lines up to %d of the %d handed (lost in a failover); "
                        "handing them again", room, mark.shard, held, mark.handed)
            # Lines below the turn played: the ones from the turn on are handed again.
            mark = RoomMark(mark.epoch, max(held, mark.next - 1), mark.shard, mark.next)
        calls = self.ingress.calls
        lease = keys.room_sweep_lease(room)
        if not await calls.call("SET", lease, self.holder, "NX", "PX", LEASE_MS):
            return 0
        try:
            done = await self.ingress.catch_up(room, mark, seq, older_than_ms=older_than_ms)
        finally:
            await calls.call("EVAL", claims.RELEASE, 1, lease, self.holder)
        if done:
            log.info("room %s: %d lines handed by the sweeper (handed %d, seq %d)", room, done, mark.handed, seq)
        return done

    def _stuck(self, room: str, mark: RoomMark) -> bool:
        """Handed lines wait (``next <= handed``) and the turn has not moved for :data:`STUCK_S`
        (since it moved, or since the last check: a long line playing costs one read per STUCK_S)."""
        if mark.next > mark.handed:
            self._turns.pop(room, None)
            return False
        now = time.monotonic()
        turn, since = self._turns.get(room, (0, now))
        if turn != mark.next:
            self._turns[room] = (mark.next, now)
            return False
        if now - since < self.stuck_s:
            return False
        self._turns[room] = (turn, now)  # checked: the next check of this turn stuck_s from now
        return True
