"""The ``voxroom`` command: ``serve``, ``gateway``, ``worker``.

This is the edge: the only place that reads the environment and configures logging.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from voxroom.errors import VoxroomError
from voxroom.runtime import client_faults_log, logredact
from voxroom.runtime.settings import Settings

log = logging.getLogger("voxroom_cli.main")


FLAGS = {"host": "--host", "port": "--port", "engine": "--engine", "cpu_contexts": "--contexts",
         "redis_url": "--redis-url", "chattts_dir": "--chattts-dir", "voices_path": "--voices",
         "worker_metrics_port": "--metrics-port"}
"""Settings a flag may give (field -> flag): a bad value is reported as the flag the operator typed."""


def _settings(args: argparse.Namespace) -> Settings:
    settings = Settings.from_env()
    changes: dict[str, Any] = {}
    for name in FLAGS:
        value = getattr(args, name, None)
        if value is not None:
            changes[name] = value
    if getattr(args, "insecure_dev", False):
        changes["insecure_dev"] = True
    return replace(settings, **changes).check({name: FLAGS[name] for name in changes if name in FLAGS})


def _logging(settings: Settings) -> None:
    from voxroom.runtime.logjson import configure

    configure(settings.log_level, settings.log_format)


def _banner(settings: Settings, text: str) -> None:
    """The one line a human starting the server looks for; a log record when logs are JSON lines."""
    if settings.log_format == "json":
        log.info("%s", text)
    else:
        print(text, flush=True)


def _run_gateway(settings: Settings, banner: str) -> None:
    import uvicorn

    from app.main import create_app
    from app.room.handshake import deadline_protocol

    app = create_app(settings)  # a missing secret stops here, before the banner says "serving"
    _banner(settings, banner)
    config = uvicorn.Config(app, host=settings.host, port=settings.port,
                            # uvicorn has no deadline on request headers of its own (slowloris).
                            http=deadline_protocol(settings.handshake_timeout_s),
                            log_level=settings.log_level.lower(), ws_max_size=64 * 1024,
                            ws_ping_interval=20.0, ws_ping_timeout=20.0, timeout_graceful_shutdown=5,
                            # PCM and Opus do not compress; deflating every frame cost a third of
                            # the gateway's CPU in the fan-out profile (docs/benchmarks.md).
                            ws_per_message_deflate=False,
                            lifespan="on",
                            # JSON logs: uvicorn's loggers propagate to the root handler instead.
                            log_config=None if settings.log_format == "json" else uvicorn.config.LOGGING_CONFIG)
    # After uvicorn configured its loggers: tokens in WebSocket URLs must never reach a log.
    logredact.install()
    # A text frame that is not UTF-8 is the client's fault: a warning line, not an ERROR traceback.
    client_faults_log.install()
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then restores the previous handlers and
    # raises the signal again. A stop that was asked for is a clean exit: let the re-raised
    # SIGTERM land on a handler that does nothing (SIGINT becomes KeyboardInterrupt, caught below).
    signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        uvicorn.Server(config).run()
    except KeyboardInterrupt:
        # uvicorn shuts down gracefully on SIGINT/SIGTERM and then re-raises the signal; the stop
        # was asked for, so it is a clean exit.
        pass


async def _worker_main(settings: Settings) -> None:
    from voxroom.store.opening import open_store
    from workers.intake.stopping import unless_stopped
    from workers.launch import build_worker

    # Signals first: a stop ends every state, waiting for Redis included (workers/intake/stopping.py).
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopping.set)
    # Opening the store asks Redis once whether it is a cluster: a stop cuts that short too.
    opened, store = await unless_stopped(open_store(settings.redis_url, job_shards=settings.job_shards), stopping)
    if not opened or store is None:
        return
    worker = build_worker(settings, store)
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, worker.stop)
    if stopping.is_set():
        worker.stop()
    try:
        await worker.run()
    finally:
        await store.aclose()


def cmd_gateway(args: argparse.Namespace) -> int:
    settings = _settings(args)
    _logging(settings)
    _run_gateway(settings, f"voxroom gateway on http://{settings.host}:{settings.port}/")
    return 0


def cmd_worker(args: argparse.Namespace) -> int:
    settings = _settings(args)
    _logging(settings)
    from workers.intake.stopping import leave_now

    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        runner.run(_worker_main(settings))
    leave_now(0)  # an engine still loading on its thread must not hold the exit
    return 0


def _loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop where it is installed (it comes with ``uvicorn[standard]``, as for the gateway):
    its callbacks, timers and socket reads cost a fraction of asyncio's, which is most of what a
    worker's loop does per slice. Plain asyncio otherwise."""
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def cmd_serve(args: argparse.Namespace) -> int:
    """Redis (unless REDIS_URL), one worker process, and the gateway in this process."""
    from voxroom.store.server import RedisServer
    from voxroom_cli import serve_discovery

    settings = _settings(args)
    _logging(settings)
    if not settings.insecure_dev:  # refuse before Redis and the worker start, not after
        from app.main import check_auth_settings

        check_auth_settings(settings)
    redis_server: RedisServer | None = None
    worker: subprocess.Popen[bytes] | None = None
    try:
        if settings.redis_url is None:
            redis_server = RedisServer().start()
            settings = replace(settings, redis_url=redis_server.url)
            log.info("started redis-server %s on %s (in memory only: nothing survives a restart)",
                     redis_server.executable, redis_server.url)
            # What the README's tour types next: redis-cli on this port, and `voxroom rooms`,
            # which finds this Redis while this serve runs (voxroom_cli/serve_discovery.py).
            serve_discovery.publish(redis_server.url)
            _banner(settings, f"redis: {redis_server.url}  (look inside: redis-cli -p {redis_server.port} "
                              "XRANGE 'vx:room:{village}:utt' - +  ; voxroom rooms finds it)")
        env = dict(os.environ, REDIS_URL=settings.redis_url or "", VOXROOM_ENGINE=settings.engine,
                   VOXROOM_CPU_CONTEXTS=str(settings.cpu_contexts), VOXROOM_LOG_LEVEL=settings.log_level)
        if settings.chattts_dir:
            env["VOXROOM_CHATTTS_DIR"] = settings.chattts_dir
        if settings.voices_path:
            env["VOXROOM_VOICES_PATH"] = settings.voices_path
        worker = subprocess.Popen([sys.executable, "-m", "voxroom_cli", "worker"], env=env)
        _run_gateway(settings, f"voxroom serving on http://{settings.host}:{settings.port}/  (Ctrl-C stops it)")
    finally:
        if redis_server is not None:
            serve_discovery.withdraw()
        if worker is not None and worker.poll() is None:
            worker.send_signal(signal.SIGTERM)
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait()
        if redis_server is not None:
            redis_server.stop()
    return 0


def cmd_token(args: argparse.Namespace) -> int:
    from voxroom.wire import tokens
    settings = Settings.from_env()
    secret = args.secret or settings.jwt_secret
    if not secret:
        print("voxroom token: set VOXROOM_JWT_SECRET or pass --secret", file=sys.stderr)
        return 2
    if args.ttl < 1:
        print(f"voxroom token: --ttl must be at least 1 second, not {args.ttl}: the token would be "
              "expired when minted", file=sys.stderr)
        return 2
    try:
        print(tokens.mint(secret, args.room, args.role, ttl_s=args.ttl, subject=args.subject))
    except ValueError as exc:
        print(f"voxroom token: {exc}", file=sys.stderr)
        return 2
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="voxroom", description="Multi-room realtime voice server.")
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p: argparse.ArgumentParser) -> None:
        p.add_argument("--redis-url", dest="redis_url", help="Redis URL (default: $REDIS_URL)")
        p.add_argument("--voices", dest="voices_path", help="voice catalog JSON file")

    def gateway_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--host", help="bind address (default 127.0.0.1)")
        p.add_argument("--port", type=int, help="port (default 8000)")
        p.add_argument("--insecure-dev", action="store_true",
                       help="no token required (local demos only; logged loudly)")

    def worker_opts(p: argparse.ArgumentParser) -> None:
        p.add_argument("--engine", choices=["auto", "offline", "chattts", "synthetic"],
                       help="auto: ChatTTS when its weights are found, else the offline voices")
        p.add_argument("--contexts", dest="cpu_contexts", type=int, help="CPU contexts when there is no GPU")
        p.add_argument("--chattts-dir", dest="chattts_dir", help="a local ChatTTS weights directory")

    serve = sub.add_parser("serve", help="everything in one process tree, on embedded defaults")
    common(serve)
    gateway_opts(serve)
    worker_opts(serve)
    serve.set_defaults(func=cmd_serve)
    gateway = sub.add_parser("gateway", help="the WebSocket gateway only (needs REDIS_URL)")
    common(gateway)
    gateway_opts(gateway)
    gateway.set_defaults(func=cmd_gateway)
    worker = sub.add_parser("worker", help="a synthesis worker only (needs REDIS_URL)")
    common(worker)
    worker_opts(worker)
    worker.add_argument("--metrics-port", dest="worker_metrics_port", type=int,
                        help="this worker's Prometheus /metrics port (default $VOXROOM_WORKER_METRICS_PORT "
                             "or 9464; 0: off); one per worker on a host")
    worker.set_defaults(func=cmd_worker)
    token = sub.add_parser("token", help="mint a signed room token (JWT, HS256)")
    token.add_argument("--room", required=True, help="a room id, or * for every room")
    token.add_argument("--role", choices=["speaker", "listener", "host"], default="speaker",
                       help="host: a speaker that may also cancel other clients' lines")
    token.add_argument("--ttl", type=int, default=3600, help="seconds until it expires (default 3600)")
    token.add_argument("--subject", help="the client id the token speaks as (optional)")
    token.add_argument("--secret", help="default: $VOXROOM_JWT_SECRET")
    token.set_defaults(func=cmd_token)
    from voxroom_cli.rooms import add_commands

    add_commands(sub, common, _settings)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args))
    except VoxroomError as exc:
        print(f"voxroom: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
