"""Whether this gateway can read Redis at all: a cut-off (a partition between it and Redis, or
Redis down) begins when its fan-out reads have failed for :data:`CUTOFF_AFTER_S` with none
succeeding, and ends with the first read back. Logged once at each end, counted in ``/metrics``
(``voxroom_redis_cutoffs``, ``voxroom_redis_cutoff_seconds``, ``voxroom_redis_cutoff_resynced``),
and told ``/readyz``, which answers 503 at once while it lasts (a load balancer moves the room's
new clients elsewhere; the ones here are replayed what they missed when it ends, app/fanout/hub.py
``resync``).

On a Redis Cluster one node failing over fails only its rooms' reads: the others' keep
succeeding, so no cut-off is declared and the gateway stays ready for the rooms it can serve.
"""

from __future__ import annotations

import logging
import time

from voxroom.runtime import metrics

log = logging.getLogger("voxroom.gateway.hub")

CUTOFF_AFTER_S = 1.0
"""Failures without a success for this long make a cut-off (a lone failed read does not)."""


class CutOff:
    def __init__(self) -> None:
        self._failing_since: float | None = None
        self.since: float | None = None
        """Monotonic time the current cut-off began; ``None`` while Redis is read."""
        self.resynced = 0
        """Listeners moved to catch up after the current cut-off (reported when it ends)."""

    @property
    def cut(self) -> bool:
        return self.since is not None

    def seconds(self) -> float:
        return time.monotonic() - self.since if self.since is not None else 0.0

    def failed(self, error: BaseException) -> None:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if self.since is None and now - self._failing_since >= CUTOFF_AFTER_S:
            self.since = self._failing_since
            metrics.REDIS_CUTOFFS.inc()
            log.warning("redis unreachable from this gateway since %.1f s ago (%s): /readyz answers 503, and "
                        "listeners here get what they miss when it is back", now - self.since, error)

    def succeeded(self) -> None:
        self._failing_since = None
        if self.since is None:
            return
        lasted = time.monotonic() - self.since
        self.since = None
        metrics.REDIS_CUTOFF_SECONDS.observe(lasted)
        metrics.REDIS_CUTOFF_RESYNCED.inc(self.resynced)
        log.warning("redis reachable again after a %.1f s cut-off: %d listeners catching up on what they missed",
                    lasted, self.resynced)
        self.resynced = 0
