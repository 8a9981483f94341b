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

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Mount, Route, WebSocketRoute
from starlette.staticfiles import StaticFiles

from app.api import rooms_api, speech_api, voices_api
from app.api.cors import Cors
from app.api.metrics import metrics_endpoint
from app.client_files import client_dir
from app.fanout.hub import RoomHub
from app.fanout.transport import TransportTap
from app.ingress.directory import WorkerDirectory
from app.room.identity import ClientClaims
from app.room.reaper import reap_stalled
from app.room.ws import room_endpoint
from app.state import GatewayState
from voxroom.errors import ConfigError
from voxroom.runtime.gc_tuning import freeze_startup_objects
from voxroom.runtime.settings import Settings
from voxroom.runtime.supervisor import Supervisor
from voxroom.store import keys
from voxroom.store.interface import IngressOptions
from voxroom.store.opening import open_store
from voxroom.voices.catalog import Catalog
from voxroom.wire import tokens
from voxroom.wire.protocol import CloseCode

log = logging.getLogger("voxroom.gateway")
CLIENT_DIR = client_dir()  # None: no client installed (app/client_files.py)


async def healthz(request: Request) -> Response:
    return JSONResponse({"status": "alive"})


async def readyz(request: Request) -> Response:
    """200 when Redis answers, some worker is alive and none of this gateway's loops is down;
    503 naming what is not, within the ping's timeout even while Redis is cut off. Says nothing
    of where Redis is (anyone may ask)."""
    state: GatewayState = request.app.state.voxroom
    if state.hub.cutoff.cut:  # no ping needed to know, and none that could hang
        return JSONResponse({"status": "redis unreachable", "for_s": round(state.hub.cutoff.seconds(), 1)},
                            status_code=503)
    try:
        await state.store.ping()
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


def ingress_options(settings: Settings) -> IngressOptions:
    return IngressOptions(utterance_maxlen=settings.utterance_stream_maxlen, jobs_maxlen=settings.jobs_maxlen,
                          max_pending_per_room=settings.max_pending_per_room, room_idle_ttl_s=settings.room_idle_ttl_s,
                          switch_lines=settings.chattts_switch_lines, wait_replicas=settings.redis_wait_replicas,
                          wait_timeout_ms=settings.redis_wait_timeout_ms)


def create_app(settings: Settings, *, catalog: Catalog | None = None) -> Starlette:
    check_auth_settings(settings)
    catalog = catalog or Catalog.for_settings(settings.voices_path, settings.default_voice)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        # The one place the gateway meets Redis: which mode is the store's business
        # (voxroom/store/opening.py); a cluster's slot map is read now, so one that cannot be
        # reached fails the start.
        store = await open_store(settings.redis_url, job_shards=settings.job_shards, connect=True)
        gateway_id = f"{os.getpid()}-{uuid.uuid4().hex[:6]}"
        supervisor = Supervisor("gateway")
        commands = store.commands()
        directory = WorkerDirectory(commands)
        claims = ClientClaims(store.commands(), store.slot_of, gateway_id)
        hub = RoomHub(store, gateway_id, supervisor=supervisor)
        streams = store.watcher(keys.gateway_wake(gateway_id, "api"), hub.control)
        state = GatewayState(
            settings=settings, catalog=catalog, store=store, commands=commands, gateway_id=gateway_id, hub=hub,
            supervisor=supervisor,
            ingress=store.ingress(ingress_options(settings)), directory=directory, claims=claims,
            streams=streams)
        app.state.voxroom = state
        with contextlib.suppress(Exception):
            await directory.refresh()
        supervisor.spawn("gateway:directory", directory.run)
        supervisor.spawn("gateway:opus-demand", hub.keep_opus_demand)
        supervisor.spawn("gateway:reaper", lambda: reap_stalled(state))
        supervisor.spawn("gateway:client-claims", claims.run)
        supervisor.spawn("gateway:streams", streams.run)
        for name, loop in store.gateway_loops(gateway_id, room_idle_ttl_s=settings.room_idle_ttl_s).items():
            supervisor.spawn(name, loop)
        freeze_startup_objects()
        log.info("gateway %s up (redis %s)", gateway_id, store.url)
        try:
            yield
        finally:
            state.draining = True
            for conn in list(state.clients):
                conn.close()
            # Together, and never held up by a client that reads nothing (its close is aborted).
            await asyncio.gather(*(conn.close_socket(CloseCode.SERVICE_RESTART, "server restarting")
                                   for conn in list(state.clients)))
            await hub.close()
            await supervisor.aclose()
            await streams.aclose()
            await claims.release_all()  # its clients reconnect elsewhere now, with the same ids
            await claims.aclose()
            await state.ingress.aclose()
            await commands.aclose()
            await hub.aclose()
            await store.aclose()
            log.info("gateway %s stopped", gateway_id)

    routes = [
        Route("/", index),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/metrics", metrics_endpoint),
        *voices_api.routes(),
        *rooms_api.routes(),
        *speech_api.routes(settings),
        WebSocketRoute("/rooms/{room_id}/ws", room_endpoint),
    ]
    if CLIENT_DIR is not None:
        routes.append(Mount("/client", app=StaticFiles(directory=CLIENT_DIR), name="client"))
    else:
        log.warning("the browser client is not installed (app/client_files.py): /client/ answers 404")
    # TransportTap outermost: it must see uvicorn's own send (app/fanout/transport.py). Cors answers
    # preflights before any route sees them; WebSockets keep admission's own Origin check.
    return Starlette(routes=routes, lifespan=lifespan,
                     middleware=[Middleware(TransportTap),
                                 Middleware(Cors, allowed_origins=settings.allowed_origins)])
