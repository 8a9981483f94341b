"""``GET /metrics``: the gateway's Prometheus endpoint (definitions in ``voxroom/runtime/metrics.py``).

Each scrape takes one snapshot of the gateway's state and, in one pipelined round trip, of the
job queue (``XLEN`` and ``XINFO GROUPS`` on ``vx:jobs``). Of the workers it exports only how many
this gateway sees alive (the directory's heartbeats, what ``/readyz`` counts): each worker serves
its own figures on its own ``/metrics`` (workers/intake/metrics.py), so a cluster-wide scrape counts
each worker once, not once per gateway. When Redis is unreachable the scrape still answers, with
``voxroom_redis_up 0``.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response

from voxroom.runtime import metrics
from voxroom.store import keys

if TYPE_CHECKING:
    from app.state import GatewayState

log = logging.getLogger("voxroom.gateway.metrics")


async def snapshot(state: GatewayState) -> metrics.GatewaySnapshot:
    sent = metrics.CLOSED_CLIENTS.sent
    dropped = metrics.CLOSED_CLIENTS.dropped
    depth_total = depth_max = 0
    for conn in state.clients:
        sent += conn.sent_audio
        dropped += conn.dropped_audio
        depth = conn.depth
        depth_total += depth
        depth_max = max(depth_max, depth)
    snap = metrics.GatewaySnapshot(
        gateway=state.gateway_id, connections=state.connections, rooms=len(state.hub.rooms),
        slices_sent=sent, slices_dropped=dropped, client_queue_total=depth_total, client_queue_max=depth_max,
        workers=state.directory.workers)
    # One job stream, or a cluster's shards (summed), where the store's layout says they are.
    streams = state.store.layout.job_streams()
    try:
        replies = await state.commands.replies(
            [command for stream in streams for command in (("XLEN", stream), ("XINFO", "GROUPS", stream))])
    except (RedisError, OSError) as exc:
        log.debug("metrics: redis unavailable: %s", exc)
        snap.redis_up = False
        return snap
    lags: list[int | None] = []
    for length, groups in zip(replies[0::2], replies[1::2], strict=True):
        if isinstance(length, int):
            snap.jobs_length = (snap.jobs_length or 0) + length
        if isinstance(groups, list):  # an error reply when the stream does not exist yet
            group = next((g for g in map(_pairs, groups) if g.get("name") == keys.JOBS_GROUP), {})
            if group:
                snap.jobs_pending = (snap.jobs_pending or 0) + int(group.get("pending") or 0)
                lag = group.get("lag")  # Redis 7 only; nil after a trim makes it unknowable
                lags.append(int(lag) if lag is not None else None)
    if lags:
        snap.jobs_lag = None if None in lags else sum(x for x in lags if x is not None)
    return snap


def _pairs(flat: Any) -> dict[str, Any]:
    """One ``XINFO GROUPS`` row (RESP2: ``[name, value, ...]``) as a dict, names as text."""
    names = [n.decode() if isinstance(n, bytes) else str(n) for n in flat[::2]]
    values = [v.decode() if isinstance(v, bytes) else v for v in flat[1::2]]
    return dict(zip(names, values, strict=True))


async def metrics_endpoint(request: Request) -> Response:
    state: GatewayState = request.app.state.voxroom
    snap = await snapshot(state)
    # Set and render with no await in between: two concurrent scrapes cannot mix their snapshots.
    metrics.COLLECTOR.snapshot = snap
    return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)
