"""A resuming client catches up: what it missed, read from Redis at the pace it drains, then live.

1. Find the client's position: scan the room's output stream back from its tail, one page at a
   time, to the last entry the client holds (``app/fanout/resume.py``). ``0-0`` when the scan reaches the
   stream's start first (all that is kept is news to the client). When that entry is a group of
   slices the client holds only the first of, it gets the group's later slices at once.
2. While the position is behind the room reader's cursor, wait until the client's queue is half
   empty, then read the next entries up to the cursor and queue as many whole entries as fit (an
   entry may hold several slices). Memory per resuming client stays within its queue bound,
   however long the replay; a client that stops reading stops its own replay (and is reaped like
   any stalled reader).
3. When the position *is* the cursor, the hub turns the client live in the same loop turn: the
   reader dispatches entries right after moving its cursor, so every entry up to the cursor was
   read here and every later one reaches the client live. When the position is *ahead* of the
   cursor (the client got entries from a faster gateway), it waits for the reader to pass it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from app.fanout.entries import entry_items, fields
from app.fanout.resume import ResumePoint, held_slices, stop_here, stream_id
from voxroom.store import keys
from voxroom.store.backoff import REDIS_DOWN, Backoff
from voxroom.store.entry_ids import entry_id_str

if TYPE_CHECKING:
    from app.fanout.connection import ClientConnection
    from app.fanout.hub import RoomHub

log = logging.getLogger("voxroom.gateway.catchup")

SCAN_PAGE = 64
"""Entries per backward page when looking for the client's position (about 150 kB of audio)."""
WAIT_READER_S = 2.0


async def find_position(hub: RoomHub, key: str, point: ResumePoint, codec: int,
                        client_id: str) -> tuple[str, list[str | bytes]]:
    """The id of the last entry the client holds (``0-0`` when none is kept), and what of that
    entry it still lacks: the later slices of a group it holds only the first of."""
    upper = "+"
    while True:
        page: Any = await hub.control.call("XREVRANGE", key, upper, "-", "COUNT", SCAN_PAGE)
        for entry_id, flat in page or []:
            entry = fields(flat)
            if stop_here(point, entry):
                return entry_id_str(entry_id), entry_items(entry, codec, client_id, skip=held_slices(point, entry))
        if not page or len(page) < SCAN_PAGE:
            return "0-0", []
        upper = "(" + entry_id_str(page[-1][0])


def _send(client: ClientConnection, items: list[str | bytes]) -> None:
    for item in items:
        if isinstance(item, bytes):
            client.send_audio(item)
        else:
            client.send_text(item)


async def catch_up(hub: RoomHub, client: ClientConnection, point: ResumePoint | None, *,
                   at: str | None = None) -> None:
    """Feed ``client`` from ``point`` (or from the entry ``at``, when its position is known: a
    live client of a room whose reads were cut off) until it is live (or closed). Redis outages
    are waited out; anything else closes the connection (the client reconnects and resumes)."""
    key = keys.room_output(client.room)
    backoff = Backoff()
    position: str | None = at
    replayed = 0
    try:
        while not client.closed:
            try:
                if position is None:
                    assert point is not None, "a catch-up starts from a point or at an entry"
                    position, rest = await find_position(hub, key, point, client.codec, client.client_id)
                    _send(client, rest)  # before anything after the position (a few slices at most)
                cursor = hub.cursor(client.room)
                if cursor is None:
                    return  # the room left this gateway: the client is leaving too
                if stream_id(position) == stream_id(cursor):
                    # No await since the cursor was read: the reader cannot have moved it.
                    if hub.go_live(client, cursor):
                        log.info("client %s in room %s resumed after %s: %d entries replayed, now live",
                                 client.client_id, client.room, point or at, replayed)
                    return
                if stream_id(position) > stream_id(cursor):
                    await hub.advanced(WAIT_READER_S)
                    continue
                await client.wait_space(client.limit // 2)
                room_left = client.limit - client.depth
                if client.closed or room_left <= 0:
                    continue
                cursor = hub.cursor(client.room) or cursor  # it only moves forward
                page: Any = await hub.control.call("XRANGE", key, "(" + position, cursor, "COUNT", room_left)
                page = page or []
                # An entry may hold several slices: queue whole entries while they fit (the first
                # always, so the replay moves on); the rest of the page is read again next time.
                queued = taken = 0
                for entry_id, flat in page:
                    items = entry_items(fields(flat), client.codec, client.client_id)
                    if taken and queued + len(items) > room_left:
                        break
                    _send(client, items)
                    queued += len(items)
                    taken += 1
                    position = entry_id_str(entry_id)
                replayed += taken
                if taken == len(page) and len(page) < room_left:
                    position = cursor  # a short page covered everything up to it (even entries trimmed away)
                backoff.reset()
            except REDIS_DOWN as exc:
                log.warning("resume of client %s in room %s: redis unavailable (%s)", client.client_id,
                            client.room, exc)
                await backoff.wait()
    except Exception:
        log.exception("resume of client %s in room %s failed; closing it", client.client_id, client.room)
        await client.reap("resume failed; reconnect")
