"""Claims on self-chosen client ids in a room (app/room/identity.py says why they exist): a key
per claim, ``vx:room:{room}:client:{id}``, held by one connection, refreshed by its gateway.

Written once for both Redis modes over :class:`~voxroom.store.interface.Commands`: a script may
touch one slot only, so a batch refresh or release runs one script per slot (a room's claims lie
in its slot; on one Redis every key is "slot 0", one script per batch), all of one pass sent
together (one round trip per node).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import secrets
from collections.abc import Callable, Iterator
from typing import Any, Final

from voxroom.store import keys
from voxroom.store.backoff import REDIS_DOWN
from voxroom.store.interface import Commands
from voxroom.store.lua import claims as lua

log = logging.getLogger("voxroom.gateway.identity")

CLAIM_TTL_S: Final = 15.0
"""A claim outlives a gateway that was killed by at most this long (one stopped cleanly releases
its claims): a client of it that reconnects elsewhere with the same id waits that long at most."""
REFRESH_EVERY_S: Final = CLAIM_TTL_S / 3
"""Two refreshes may fail (Redis restarting) before a live claim could expire."""
REFRESH_BATCH: Final = 500
CLAIM_WAIT_S: Final = 3.0
"""How long a connection whose id is held waits for it before being refused: a client that closes
and reconnects at once would otherwise race its old connection's release (which runs after the
close handshake) and lose."""
CLAIM_RETRY_S: Final = 0.1


def claim_secret(owner: str) -> str:
    """The secret of a claim (for the client's ``welcome``) from its owner token."""
    return owner.split(":", 1)[0]


class ClientClaims:
    """This gateway's claims on self-chosen client ids, kept alive by :meth:`run`. ``commands``:
    text replies (owned: closed by :meth:`aclose`); ``slot_of``: the store's."""

    def __init__(self, commands: Commands, slot_of: Callable[[str], int], gateway_id: str, *,
                 ttl_s: float = CLAIM_TTL_S) -> None:
        self._commands = commands
        self._slot_of = slot_of
        self._gateway_id = gateway_id
        self._ttl_ms = int(ttl_s * 1000)
        self._serial = itertools.count(1)
        self._owned: dict[str, str] = {}
        """claim key -> owner token (gateway id and a serial: one connection's own claim)."""

    def __len__(self) -> int:
        return len(self._owned)

    async def claim(self, room: str, client: str, *, secret: str | None = None,
                    wait_s: float = CLAIM_WAIT_S) -> str | None:
        """Claim ``client`` in ``room``: the owner token to :meth:`release` it with (it starts
        with the claim's secret, see :func:`claim_secret`), or ``None`` when another live
        connection still holds it after ``wait_s``. ``secret``: what the client presented
        (``?claim=``); the holder's secret takes the claim over at once. Raises one of
        :data:`REDIS_DOWN`."""
        key = keys.room_client_claim(room, client)
        serial = next(self._serial)
        fresh = f"{secrets.token_urlsafe(18)}:{self._gateway_id}:{serial}"
        takeover = f"{secret}:{self._gateway_id}:{serial}" if secret else ""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_s
        while True:
            got = int(await self._commands.call("EVAL", lua.CLAIM, 1, key, fresh, self._ttl_ms, secret or "",
                                                takeover))
            if got:
                owner = fresh if got == 1 else takeover
                self._owned[key] = owner
                return owner
            if loop.time() >= deadline:
                return None
            await asyncio.sleep(CLAIM_RETRY_S)

    async def release(self, room: str, client: str, owner: str) -> None:
        """Give the claim back (never raises: a claim that cannot be deleted expires)."""
        key = keys.room_client_claim(room, client)
        if self._owned.get(key) == owner:
            del self._owned[key]
        try:
            await self._commands.call("EVAL", lua.RELEASE, 1, key, owner)
        except REDIS_DOWN as exc:
            log.debug("claim %s not released (it expires in %d ms): %s", key, self._ttl_ms, exc)

    async def release_all(self) -> None:
        """Give back every claim this gateway holds (shutdown: its clients reconnect elsewhere at
        once, with the same ids). Never raises."""
        owned, self._owned = list(self._owned.items()), {}
        try:
            await self._per_slot(owned, lua.RELEASE_MANY, ())
        except REDIS_DOWN as exc:
            log.warning("%d client id claims not released (they expire in %d ms): %s", len(owned), self._ttl_ms,
                        exc)

    async def refresh(self) -> int:
        """Extend every live claim once; how many were found taken by someone else."""
        return sum(await self._per_slot(list(self._owned.items()), lua.REFRESH, (self._ttl_ms,)))

    async def _per_slot(self, items: list[tuple[str, str]], script: str, first: tuple[Any, ...]) -> list[int]:
        """``script`` once per slot batch of ``(key, owner)`` items (``ARGV``: ``first`` then the
        owners), all sent together; each script's reply. Raises the first error."""
        if not items:
            return []
        replies = await self._commands.group([
            ("EVAL", script, len(batch), *(k for k, _ in batch), *first, *(o for _, o in batch))
            for batch in _by_slot(items, self._slot_of)])
        return [int(reply) for reply in replies]

    async def run(self) -> None:
        """Refresh every :data:`REFRESH_EVERY_S` until cancelled. Redis being away is waited out."""
        while True:
            await asyncio.sleep(REFRESH_EVERY_S)
            try:
                lost = await self.refresh()
            except REDIS_DOWN as exc:
                log.warning("client id claims not refreshed, redis unavailable: %s", exc)
                continue
            if lost:
                log.warning("%d client id claims expired while redis was unreachable and were taken", lost)

    async def aclose(self) -> None:
        await self._commands.aclose()


def _by_slot(items: list[tuple[str, str]], slot_of: Callable[[str], int]) -> Iterator[list[tuple[str, str]]]:
    """``items`` in batches of one slot each, at most :data:`REFRESH_BATCH` long."""
    slots: dict[int, list[tuple[str, str]]] = {}
    for item in items:
        slots.setdefault(slot_of(item[0]), []).append(item)
    for batch in slots.values():
        for start in range(0, len(batch), REFRESH_BATCH):
            yield batch[start:start + REFRESH_BATCH]
