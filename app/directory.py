"""What the gateway knows of the workers: who is alive and which engines they serve.

Read from the workers' heartbeat hashes every ``interval_s``; used by ``/readyz`` and to refuse a
voice that no live worker can speak (instead of accepting it and failing later).
"""

from __future__ import annotations

import asyncio
import logging

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from voxroom import keys

log = logging.getLogger("voxroom.gateway.directory")


class WorkerDirectory:
    def __init__(self, redis: Redis, *, interval_s: float = 2.0) -> None:
        self.redis = redis
        self.interval_s = interval_s
        self.workers: dict[str, dict[str, str]] = {}
        self.engines: set[str] = set()
        self.voices: set[str] = set()
        self.seen_any = False

    async def refresh(self) -> None:
        found: dict[str, dict[str, str]] = {}
        async for key in self.redis.scan_iter(match=keys.worker_pattern(), count=100):
            name = key.decode() if isinstance(key, bytes) else key
            raw = await self.redis.hgetall(name)
            found[name.rsplit(":", 1)[-1]] = {
                (k.decode() if isinstance(k, bytes) else k): (v.decode() if isinstance(v, bytes) else v)
                for k, v in raw.items()}
        self.workers = found
        self.engines = {e for w in found.values() for e in w.get("engines", "").split(",") if e}
        self.voices = {v for w in found.values() for v in w.get("voices", "").split(",") if v}
        self.seen_any = self.seen_any or bool(found)

    def serves(self, voice_id: str) -> bool:
        """Before any worker has ever been seen, every catalog voice is allowed (workers may still
        be loading); afterwards only voices some live worker speaks."""
        return not self.seen_any or voice_id in self.voices

    async def run(self) -> None:
        while True:
            try:
                await self.refresh()
            except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                log.warning("worker directory: redis unavailable: %s", exc)
            await asyncio.sleep(self.interval_s)
