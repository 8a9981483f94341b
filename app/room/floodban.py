"""Client addresses closed for flooding, refused for a while when they come back.

A client closed with 1008 for flooding could reconnect at once and flood again, paying only a
handshake per hundred refused frames. The gateway remembers the address (``scope["client"]``:
behind nginx that is the client's own, from ``X-Forwarded-For``, which uvicorn trusts from
loopback) for ``settings.flood_ban_s`` and refuses new connections from it with 1008.

The table is bounded (:data:`MAX_ENTRIES`): every ban lasts as long, so insertion order is expiry
order and the oldest ban is the one evicted when it is full. Pure: the clock is passed in.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Final

MAX_ENTRIES: Final = 10_000
"""About 1 MB at most; an attacker with more addresses than this evicts only the oldest bans."""


class FloodBans:
    __slots__ = ("_until", "max_entries")

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self.max_entries = max_entries
        self._until: OrderedDict[str, float] = OrderedDict()

    def __len__(self) -> int:
        return len(self._until)

    def ban(self, address: str, until: float) -> None:
        """Refuse ``address`` until the monotonic time ``until`` (a later ban replaces an earlier)."""
        self._until.pop(address, None)
        self._until[address] = until
        while len(self._until) > self.max_entries:
            self._until.popitem(last=False)

    def remaining(self, address: str, now: float) -> float:
        """Seconds ``address`` is still refused (0.0: it may connect). Ended bans are forgotten."""
        while self._until:
            oldest, until = next(iter(self._until.items()))
            if until > now:
                break
            del self._until[oldest]
        ends = self._until.get(address)
        return ends - now if ends is not None and ends > now else 0.0
