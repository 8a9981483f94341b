"""Room sockets held open per client address: one address cannot take the whole gateway.

``max_connections`` bounds a gateway's sockets (20,000). Without a bound per address, one script on
one machine could open all of them, idle, and every other player would be closed with 1013 "gateway
full" until it let go. So each address holds at most ``max_connections_per_address`` at once; past
it the new socket is closed with 1013 (try again later), and the address's other sockets, and
everyone else, are untouched.

The address is the one the flood ban uses (``app/room/admission.py``, ``ban_address``): the client's own
behind a proxy uvicorn trusts (``X-Forwarded-For``), none behind one it does not (every client
would share the proxy's address: counting it would cap them all together).

The table holds one entry per address with a socket open, so it is bounded by the connections
themselves. Pure: no I/O, no clock.
"""

from __future__ import annotations


class AddressSlots:
    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[str, int] = {}

    def __len__(self) -> int:
        """Addresses with a socket open."""
        return len(self._held)

    def held(self, address: str) -> int:
        return self._held.get(address, 0)

    def full(self, address: str, limit: int) -> bool:
        """``address`` holds ``limit`` sockets already (never, with ``limit`` 0: no limit)."""
        return limit > 0 and self._held.get(address, 0) >= limit

    def take(self, address: str) -> None:
        self._held[address] = self._held.get(address, 0) + 1

    def give(self, address: str) -> None:
        """One socket of ``address`` closed; the entry goes with its last one."""
        left = self._held.get(address, 0) - 1
        if left > 0:
            self._held[address] = left
        else:
            self._held.pop(address, None)
