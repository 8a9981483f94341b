"""The gateway application: ``create_app(settings)`` builds a Starlette app.

Resources (Redis clients, the room hub, the worker directory) are created in the lifespan and
reached through ``app.state.voxroom``. Shutdown order: stop accepting, close every client with
1012 (they reconnect, possibly to another gateway), stop the readers, close Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass

from redis.asyncio.cluster import RedisCluster
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from app import speech_api, voices_api
from app.client_files import client_dir
from app.cors import Cors
from app.directory import WorkerDirectory
from app.handoff import HandOff
from app.hub import RoomHub
from app.identity import ClientClaims
from app.ingress import Ingress
from app.metrics import metrics_endpoint
from app.reaper import reap_stalled
from app.state import GatewayState
from app.sweeper import Sweeper
from app.transport import TransportTap
from app.ws import room_endpoint
from voxroom import keys, redis_client, tokens
from voxroom.backoff import REDIS_DOWN
from voxroom.cluster_autopipe import ClusterAutoPipeline
from voxroom.errors import ConfigError
from voxroom.gc_tuning import freeze_startup_objects
from voxroom.protocol import CloseCode
from voxroom.settings import Settings
from voxroom.stream_watcher import StreamWatcher
from voxroom.supervisor import Supervisor
from voxroom.voices import Catalog

log = logging.getLogger("voxroom.gateway")
CLIENT_DIR = client_dir()  # None: no client installed (app/client_files.py)


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "alive"})


async def readyz(request: Request) -> Response:
    """200 when Redis answers, some worker is alive and none of this gateway's loops is down;
    503 naming what is not. Says nothing of where Redis is (anyone may ask)."""
    state: GatewayState = request.app.state.voxroom
    try:
        await state.redis.ping()
    except Exception as exc:  # any failure to reach Redis means not ready
        return JSONResponse({"status": "redis unreachable", "error": type(exc).__name__}, status_code=503)
    down = state.supervisor.down()
    body = {"workers": len(state.directory.workers), "loops_down": down,
            "worker_loops_down": state.directory.loops_down()}
    if down:
        return JSONResponse({"status": f"loops down: {', '.join(down)}", **body}, status_code=503)
    if not state.directory.workers:
        return JSONResponse({"status": "no worker alive", **body}, status_code=503)
    return JSONResponse({"status": "ready", **body})


async def index(request: Request) -> Response:
    page = CLIENT_DIR / "demo" / "index.html" if CLIENT_DIR is not None else None
    if page is None or not page.exists():
        return JSONResponse({"service": "voxroom", "websocket": "/rooms/{room_id}/ws"})
    return FileResponse(page)


def check_auth_settings(settings: Settings) -> None:
    """Auth is on unless explicitly turned off: refuse to start without a usable secret."""
    if settings.insecure_dev:
        log.warning("INSECURE DEV MODE: no token is required to join or speak in any room. "
                    "Never expose this gateway.")
        return
    if not settings.jwt_secret:
        raise ConfigError("set VOXROOM_JWT_SECRET (room tokens) or pass --insecure-dev for a local demo")
    if len(settings.jwt_secret.encode()) < tokens.MIN_SECRET_BYTES:
        raise ConfigError(f"VOXROOM_JWT_SECRET must be at least {tokens.MIN_SECRET_BYTES} bytes")


@dataclass(frozen=True, slots=True)
class _ClusterClients:
    text: RedisCluster
    raw: RedisCluster
    """Bytes replies: the hub's and the stream watcher's reads carry audio."""


async def _cluster_clients(url: str) -> _ClusterClients | None:
    """The cluster clients when ``url`` names a Redis Cluster node (``INFO cluster``), else
    ``None``. A Redis that cannot be asked now counts as one instance, as it always did."""
    if not await asyncio.to_thread(redis_client.cluster_enabled, url):
        return None
    return _ClusterClients(text=await redis_client.cluster_from_url(url, decode_responses=True),
                           raw=await redis_client.cluster_from_url(url, decode_responses=False))


def create_app(settings: Settings, *, catalog: Catalog | None = None) -> Starlette:
    check_auth_settings(settings)
    catalog = catalog or Catalog.for_settings(settings.voices_path, settings.default_voice)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        url = settings.redis_url or "redis://127.0.0.1:6379/0"
        text_redis = redis_client.from_url(url, decode_responses=True)
        bytes_redis = redis_client.from_url(url, decode_responses=False)
        gateway_id = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        directory = WorkerDirectory(text_redis)
        supervisor = Supervisor("gateway")
        # Redis Cluster (chosen once, at start; docs/cluster.md): the hub, the stream watcher and
        # the claims run on cluster clients; lines are accepted in their room's slot and handed
        # to a job shard (app/handoff.py). One instance keeps its clients and its one say script.
        cluster = await _cluster_clients(url)
        handoff: HandOff | None = None
        if cluster is not None:
            # One autopipeline per node (text replies) for the hand-off, the sweeper and the
            # directory: the commands of one loop turn share a round trip per node.
            routed = ClusterAutoPipeline(cluster.text)
            handoff = HandOff(routed, shards=settings.job_shards, jobs_maxlen=settings.jobs_maxlen,
                              wait_replicas=settings.redis_wait_replicas,
                              wait_timeout_ms=settings.redis_wait_timeout_ms,
                              room_idle_ttl_s=settings.room_idle_ttl_s)
            directory.auto = routed  # the registry lies in its own slot
        claims = ClientClaims(cluster.text if cluster is not None else text_redis, gateway_id)
        hub_redis = cluster.raw if cluster is not None else bytes_redis
        state = GatewayState(
            settings=settings, catalog=catalog, redis=text_redis, gateway_id=gateway_id,
            hub=RoomHub(hub_redis, gateway_id, supervisor=supervisor), supervisor=supervisor,
            ingress=Ingress(text_redis, utterance_maxlen=settings.utterance_stream_maxlen,
                            jobs_maxlen=settings.jobs_maxlen,
                            max_pending_per_room=settings.max_pending_per_room,
                            room_idle_ttl_s=settings.room_idle_ttl_s,
                            switch_lines=settings.chattts_switch_lines, handoff=handoff,
                            wait_replicas=settings.redis_wait_replicas,
                            wait_timeout_ms=settings.redis_wait_timeout_ms),
            directory=directory, claims=claims, cluster=cluster.text if cluster is not None else None)
        state.streams = StreamWatcher(hub_redis, state.hub.control, keys.gateway_wake(gateway_id, "api"))
        app.state.voxroom = state
        with contextlib.suppress(Exception):
            await directory.refresh()
        supervisor.spawn("gateway:directory", directory.run)
        supervisor.spawn("gateway:opus-demand", state.hub.keep_opus_demand)
        supervisor.spawn("gateway:reaper", lambda: reap_stalled(state))
        supervisor.spawn("gateway:client-claims", claims.run)
        supervisor.spawn("gateway:streams", state.streams.run)
        if handoff is not None:
            sweeper = Sweeper(handoff, gateway_id, room_idle_ttl_s=settings.room_idle_ttl_s)
            supervisor.spawn("gateway:sweeper", sweeper.run)
        freeze_startup_objects()
        log.info("gateway %s up (redis %s)", gateway_id, url)
        try:
            yield
        finally:
            state.draining = True
            for conn in list(state.clients):
                conn.close()
            # Together, and never held up by a client that reads nothing (its close is aborted).
            await asyncio.gather(*(conn.close_socket(CloseCode.SERVICE_RESTART, "server restarting")
                                   for conn in list(state.clients)))
            await state.hub.close()
            await supervisor.aclose()
            await state.streams.aclose()
            if cluster is None:  # a cluster's watcher has no wake stream
                with contextlib.suppress(*REDIS_DOWN):
                    await bytes_redis.delete(state.streams.wake_key)
            await claims.release_all()  # its clients reconnect elsewhere now, with the same ids
            await directory.aclose()
            await state.ingress.aclose()
            if cluster is not None:
                await cluster.text.aclose()
                await cluster.raw.aclose()
            await text_redis.aclose()
            await bytes_redis.aclose()
            log.info("gateway %s stopped", gateway_id)

    routes = [
        Route("/", index),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics_endpoint),
        *voices_api.routes(),
        *speech_api.routes(settings),
        WebSocketRoute("/rooms/{room_id}/ws", room_endpoint),
    ]
    if CLIENT_DIR is not None:
        routes.append(Mount("/client", app=StaticFiles(directory=CLIENT_DIR), name="client"))
    else:
        log.warning("the browser client is not installed (app/client_files.py): /client/ answers 404")
    # TransportTap outermost: it must see uvicorn's own send (app/transport.py). Cors answers
    # preflights before any route sees them; WebSockets keep admission's own Origin check.
    return Starlette(routes=routes, lifespan=lifespan,
                     middleware=[Middleware(TransportTap),
                                 Middleware(Cors, allowed_origins=settings.allowed_origins)])
