"""``GET /metrics``: the gateway's Prometheus endpoint (definitions in ``voxroom/metrics.py``).

Each scrape takes one snapshot of the gateway's state and, in one pipelined round trip, of the
job queue (``XLEN`` and ``XINFO GROUPS`` on ``vx:jobs``). Of the workers it exports only how many
this gateway sees alive (the directory's heartbeats, what ``/readyz`` counts): each worker serves
its own figures on its own ``/metrics`` (workers/metrics.py), so a cluster-wide scrape counts
each worker once, not once per gateway. When Redis is unreachable the scrape still answers, with
``voxroom_redis_up 0``.
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response

from app.state import GatewayState
from voxroom import keys, metrics

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
    try:
        pipe = state.redis.pipeline(transaction=False)
        pipe.xlen(keys.JOBS)
        pipe.xinfo_groups(keys.JOBS)
        length, groups = await pipe.execute(raise_on_error=False)
    except (RedisError, OSError) as exc:
        log.debug("metrics: redis unavailable: %s", exc)
        snap.redis_up = False
        return snap
    if isinstance(length, int):
        snap.jobs_length = length
    if isinstance(groups, list):  # an error object when the stream does not exist yet
        group: dict[str, Any] = next((g for g in groups if g.get("name") == keys.JOBS_GROUP), {})
        if group:
            snap.jobs_pending = int(group.get("pending") or 0)
            lag = group.get("lag")  # Redis 7 only; None after a trim makes it unknowable
            snap.jobs_lag = int(lag) if lag is not None else None
    return snap


async def metrics_endpoint(request: Request) -> Response:
    state: GatewayState = request.app.state.voxroom
    snap = await snapshot(state)
    # Set and render with no await in between: two concurrent scrapes cannot mix their snapshots.
    metrics.COLLECTOR.snapshot = snap
    return Response(generate_latest(metrics.REGISTRY), media_type=CONTENT_TYPE_LATEST)
