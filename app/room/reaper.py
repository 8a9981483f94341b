"""The gateway's stalled-reader reaper: a supervised loop that closes clients that stopped reading.

Drop-oldest keeps a slow listener's queue bounded, but a client that never reads still holds its
socket, its queue (up to ``send_queue_slices`` frames) and, below it, the kernel's buffers (about
2 MB on loopback) for as long as it likes. A connection whose queue has been full, or whose socket
write has been blocked, for ``send_stall_close_s`` is reaped (``ClientConnection.reap``: queue freed,
1013 with a reason, the TCP connection aborted when not even that can be written).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from app.state import GatewayState


log = logging.getLogger("voxroom.gateway.reaper")


async def reap_stalled(state: GatewayState) -> None:
    """Run forever: every quarter of the setting (at most a second), reap the stalled clients."""
    limit = state.settings.send_stall_close_s
    every = min(1.0, max(0.05, limit / 4))
    while True:
        await asyncio.sleep(every)
        now = time.monotonic()
        stalled = [c for c in state.clients if c.reaped is None and c.stalled_for(now) >= limit]
        if not stalled:
            continue
        log.warning("closing %d client(s) that read nothing for %.1f s", len(stalled), limit)
        await asyncio.gather(*(c.reap(f"send stalled for {limit:g} s") for c in stalled))
