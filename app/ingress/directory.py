"""What the gateway knows of the workers: who is alive and which engines they serve.

Read every ``interval_s`` from the ``vx:workers`` registry (worker id -> last heartbeat, ms) and
the heartbeat hashes it names, in one pipelined round trip: no SCAN of the keyspace. Used by
``/readyz`` (which also reports workers whose own loops are down) and to refuse a voice that no
live worker can speak (instead of accepting it and failing later).

A worker is alive while its heartbeat hash exists (it has a 10 s TTL). The registry's score is
only a coarse filter (:data:`REGISTRY_CUTOFF_S`): during a Redis OOM a live worker can still
refresh its hash's TTL (``EXPIRE`` is allowed then) but not its registry score (``ZADD`` is not), and
it must not vanish from the directory for that.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from voxroom.store import keys
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.interface import Commands
from voxroom.voices import mix as voice_mix

log = logging.getLogger("voxroom.gateway.directory")

REGISTRY_CUTOFF_S = 600
"""Registry entries older than this are not even looked at (workers gone long ago)."""


class WorkerDirectory:
    def __init__(self, auto: Commands, *, interval_s: float = 2.0) -> None:
        """``auto``: what the reads go through (text replies; its owner closes it). On a cluster
        the registry and each heartbeat hash lie in slots of their own: one refresh's reads share
        a round trip per node."""
        self.interval_s = interval_s
        self.auto = auto
        self.workers: dict[str, dict[str, str]] = {}
        self.engines: set[str] = set()
        self.voices: set[str] = set()
        self.seen_any = False

    async def refresh(self) -> None:
        cutoff = int(time.time() * 1000) - REGISTRY_CUTOFF_S * 1000
        ids: Any = await self.auto.call("ZRANGE", keys.WORKERS, "+inf", cutoff, "BYSCORE", "REV")
        names = [_text(i) for i in ids or []]
        hashes: list[Any] = (await self.auto.group([("HGETALL", keys.worker_heartbeat(n)) for n in names])
                             if names else [])
        found: dict[str, dict[str, str]] = {}
        for name, flat in zip(names, hashes, strict=True):
            if flat:  # RESP2: [field, value, ...]; empty once the hash expired
                found[name] = {_text(k): _text(v) for k, v in zip(flat[::2], flat[1::2], strict=True)}
        self.workers = found
        self.engines = {e for w in found.values() for e in w.get("engines", "").split(",") if e}
        self.voices = {v for w in found.values() for v in w.get("voices", "").split(",") if v}
        self.seen_any = self.seen_any or bool(found)

    def loops_down(self) -> dict[str, list[str]]:
        """Workers whose heartbeat says some of their loops are down: worker -> loop names."""
        return {name: down.split(",") for name, w in sorted(self.workers.items()) if (down := w.get("loops_down"))}

    def serves(self, voice_id: str) -> bool:
        """Before any worker has ever been seen, every catalog voice is allowed (workers may still
        be loading); afterwards only voices some live worker speaks."""
        if not self.seen_any or voice_id in self.voices:
            return True
        parts = voice_mix.part_ids(voice_id)  # a mix: where every one of its voices is served
        return len(parts) > 1 and all(part in self.voices for part in parts)

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
            except REDIS_DOWN as exc:
                log.warning("worker directory: redis unavailable: %s", exc)
            await asyncio.sleep(self.interval_s)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
