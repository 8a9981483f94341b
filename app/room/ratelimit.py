"""Token buckets for per-connection rate limits (pure: the clock is passed in)."""

from __future__ import annotations


class TokenBucket:
    """``rate`` tokens a second, at most ``burst`` saved up. Not thread-safe (one connection is
    one coroutine's business)."""

    __slots__ = ("_at", "_tokens", "burst", "rate")

    def __init__(self, rate: float, burst: float, now: float) -> None:
        self.rate = rate
        self.burst = burst
        self._tokens = burst
        self._at = now

    def take(self, now: float, cost: float = 1.0) -> float:
        """Spend ``cost`` tokens: returns 0.0 when allowed, else the seconds until it would be."""
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        if self._tokens >= cost:
            self._tokens -= cost
            return 0.0
        return (cost - self._tokens) / self.rate
