"""docker-compose.yml as a running stack: its services started as local processes, each with exactly
the service's ``command`` and ``environment`` (compose's ``${VAR:-default}`` interpolation applied),
in the order of their ``depends_on``, each waited for by its own ``healthcheck`` where it has one.
Then, through nginx as the file mounts it: ``/readyz``, the demo page and the client module, a room
that hears lines from the worker's batching engine (ChatTTS), and ``/v1/audio/speech``.

There is no Docker engine here (nor in CI), so a container's surroundings are given by these
translations, and by nothing else:

- Host names and ports. Service host names in values (``redis``, ``gateway-1``, ``gateway-2``) are
  ``127.0.0.1``; every container port is a free port: redis gets ``--port N --bind 127.0.0.1``
  appended to its command (and ``redis-cli`` in its healthcheck ``-p N``), a gateway's
  ``--port 8000`` (and the port in its healthcheck's URL) is N, nginx's ``NGINX_LISTEN`` (``80``)
  is ``127.0.0.1:N``, and the worker gets ``VOXROOM_WORKER_METRICS_PORT=N`` (its default is the
  9464 the service exposes; the test checks that they agree).
- Container paths are temporary directories. The worker's ``./models:/models`` mount (``/models``
  in its command) holds a tiny randomly initialised ChatTTS checkpoint (no weights can be
  downloaded here); redis runs in a directory of its own, as the image's working directory
  ``/data`` (the ``redis-data`` volume); nginx's ``/etc/nginx`` is a temporary prefix laid out as
  the official image's template step lays it out, as in tests/ops/test_nginx.py (``-p``/``-c``, the
  pid file by ``-g``, the temp paths in a drop-in beside the rendered templates).
- The operator's variables, which compose reads from the shell or ``.env``: ``VOXROOM_JWT_SECRET``
  (required) is a throwaway secret, and ``VOXROOM_CHATTTS_SOURCE=custom``, the documented choice for
  a model of one's own that carries its hashes (the tiny checkpoint). Every other ``${...}`` takes
  the file's default.
- The image's environment: ``PATH`` (the virtual environment's ``bin`` first, so that ``voxroom`` and
  ``python`` are the installed ones, as in the image), ``PYTHONUNBUFFERED=1`` (the Dockerfile's
  ``ENV``) and ``HOME`` (an empty directory).

Not applied: ``ulimits`` (the host's own limit stands), the GPU reservation (no GPU: the worker runs
its CPU contexts), restart policies. One worker runs (``worker-gpu0``); both gateways run, because
nginx's upstream names both.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import websockets
import yaml

from tests.ops.test_nginx import envsubst, nginx_command
from tests.support.audio import SILENCE_DBFS, dbfs, rms
from tests.support.processes import ROOT
from tests.support.room_client import RoomClient
from voxroom.runtime.settings import Settings
from voxroom.store.server import free_port
from voxroom.wire.protocol import ROOM_RATE, AudioFrame

pytestmark = [pytest.mark.chattts, pytest.mark.slow]

COMPOSE = ROOT / "docker-compose.yml"
SECRET = secrets.token_hex(32)  # the gateway wants 32 bytes at least, as `openssl rand -hex 32` gives
OPERATOR = {"VOXROOM_JWT_SECRET": SECRET, "VOXROOM_CHATTTS_SOURCE": "custom"}
"""What an operator exports before ``docker compose up`` (see the module docstring)."""
RUN = ("redis", "gateway-1", "gateway-2", "worker-gpu0", "nginx")
CHATTTS_VOICE = "eng-chattts-1111"
LINE = "The caravan reaches the river at dawn."
LINES = (LINE, "Torches are lit along the wall.", "天黑请闭眼。")
START_S = 90.0  # a busy CI machine: torch and ChatTTS load in the worker


def interpolate(value: str, environ: dict[str, str]) -> str:
    """Compose's interpolation: ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``, ``${VAR:?error}``,
    ``${VAR?error}``, ``$VAR`` and ``$$``."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group(1) or m.group(4)
        op, arg = m.group(2) or "", m.group(3) or ""
        value = environ.get(name)
        unset = value is None or (op.startswith(":") and value == "")
        if op.endswith("-"):
            return arg if unset else str(value)
        if op.endswith("?") and unset:
            raise AssertionError(f"compose refuses to start: {name}: {arg}")
        return value or ""
    return re.sub(r"\$\$|\$\{(\w+)(:?[-?])?([^}]*)\}|\$(\w+)", one, value)


@dataclass
class Service:
    name: str
    command: list[str]
    environment: dict[str, str]
    spec: dict[str, Any]

    def depends_on(self) -> list[str]:
        deps = self.spec.get("depends_on") or []
        return list(deps) if isinstance(deps, (list, dict)) else []


def load_services() -> dict[str, Service]:
    services: dict[str, dict[str, Any]] = yaml.safe_load(COMPOSE.read_text())["services"]
    out = {}
    for name, spec in services.items():
        env = spec.get("environment") or {}
        if isinstance(env, list):
            env = dict(item.split("=", 1) for item in env)
        out[name] = Service(name, [interpolate(str(p), OPERATOR) for p in spec.get("command") or []],
                            {k: interpolate(str(v), OPERATOR) for k, v in env.items()}, spec)
    return out


def start_order(services: dict[str, Service]) -> list[str]:
    """``RUN`` in an order that honours every ``depends_on`` among them."""
    done: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"depends_on cycle: {path}"
        assert name in services, f"{path[-1]} depends on {name}, which is not a service"
        for dep in services[name].depends_on():
            if dep in RUN:
                visit(dep, (*path, name))
        if name not in done:
            done.append(name)
    for name in RUN:
        visit(name, ())
    return done


@dataclass
class Translation:
    """The container surroundings of the module docstring, in one place."""
    tmp: Path
    ports: dict[str, int] = field(default_factory=dict)

    def host(self, text: str) -> str:
        """``redis:6379``, ``gateway-1:8000`` -> ``127.0.0.1:<that service's port>``."""
        def one(m: re.Match[str]) -> str:
            return f"127.0.0.1:{self.ports[m.group(1)]}"
        return re.sub(r"\b(redis|gateway-\d+):\d+\b", one, text)

    def path(self, text: str) -> str:
        return text.replace("/models", str(self.tmp / "models")) if text.startswith("/models") else text

    def environ(self, service: Service, **more: str) -> dict[str, str]:
        image = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
                 "PYTHONUNBUFFERED": "1", "HOME": str(self.tmp / "home")}
        return {**image, **{k: self.host(v) for k, v in service.environment.items()}, **more}


class Process:
    """A service's process with a working directory of its own (``Proc`` runs in the checkout)."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path, log: Path) -> None:
        self.log_path = log
        self._log = open(log, "ab")  # closed in stop()
        self.popen = subprocess.Popen(args, env=env, cwd=cwd, stdout=self._log, stderr=subprocess.STDOUT,
                                      start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def log_text(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM, as ``docker compose down`` sends; SIGKILL past the grace."""
        for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 10)):
            if not self.alive():
                break
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)  # its own session: the group is the service
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(grace)
        self._log.close()


def healthcheck(service: Service, translate: list[str], env: dict[str, str], what: Process) -> None:
    """Run the service's own healthcheck command (``CMD`` form), translated, until it passes."""
    test = service.spec["healthcheck"]["test"]
    assert test[0] == "CMD", test
    deadline = time.monotonic() + START_S
    while True:
        done = subprocess.run(translate, env=env, capture_output=True, text=True, timeout=10)
        if done.returncode == 0:
            return
        if not what.alive() or time.monotonic() > deadline:
            raise AssertionError(f"{service.name}: healthcheck {translate} failed: {done.stderr[-2000:]}\n"
                                 f"{what.log_text()[-3000:]}")
        time.sleep(0.2)


def render_nginx(service: Service, env: dict[str, str], prefix: Path) -> Path:
    """What the official image does at start, with the service's mounts and environment:
    ``nginx.conf`` as is, and every ``templates/**/*.template`` through envsubst into ``conf.d/``."""
    etc = "/etc/nginx"
    mounts = {target: ROOT / source for source, target, *_ in (v.split(":") for v in service.spec["volumes"])}
    assert f"{etc}/nginx.conf" in mounts and f"{etc}/templates" in mounts, mounts
    templates = mounts[f"{etc}/templates"]
    rendered = sorted(templates.rglob("*.template"))
    assert rendered, templates
    for template in rendered:
        out = prefix / "conf.d" / template.relative_to(templates).with_suffix("")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(envsubst(template.read_text(), env))
    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (prefix / f"{kind}_temp").mkdir(exist_ok=True)
    (prefix / "conf.d" / "voxroom" / "zz-test-paths.conf").write_text(
        "".join(f"{kind}_temp_path {prefix}/{kind}_temp;\n"
                for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")))
    conf = prefix / "nginx.conf"
    shutil.copyfile(mounts[f"{etc}/nginx.conf"], conf)
    return conf


def http(url: str, *, data: bytes | None = None, headers: dict[str, str] | None = None,
         timeout: float = 60) -> tuple[int, dict[str, str], bytes]:
    request = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return int(resp.status), {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, {k.lower(): v for k, v in exc.headers.items()}, exc.read()


def answers(url: str) -> bool:
    try:
        return http(url, timeout=2)[0] == 200
    except OSError:  # not listening yet
        return False


@dataclass
class Stack:
    services: dict[str, Service]
    translation: Translation
    procs: dict[str, Process]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.translation.ports['nginx']}"

    def token(self, room: str) -> str:
        """A speaker token minted as docs/deployment.md says (``docker compose exec gateway-1 voxroom
        token ...``): the CLI in gateway-1's environment."""
        gateway = self.services["gateway-1"]
        done = subprocess.run(["voxroom", "token", "--room", room, "--role", "speaker", "--ttl", "600"],
                              env=self.translation.environ(gateway), cwd=ROOT, capture_output=True,
                              text=True, timeout=60, check=True)
        return done.stdout.strip()


def start(service: Service, t: Translation, procs: dict[str, Process]) -> None:
    logs = t.tmp / "logs"
    name, cmd = service.name, list(service.command)
    if name == "redis":
        port = t.ports[name] = free_port()
        data = t.tmp / "redis-data"
        data.mkdir()
        procs[name] = Process([*cmd, "--port", str(port), "--bind", "127.0.0.1"], t.environ(service), data,
                              logs / f"{name}.log")
        test = service.spec["healthcheck"]["test"][1:]
        healthcheck(service, [test[0], "-p", str(port), *test[1:]], t.environ(service), procs[name])
    elif cmd[:2] == ["voxroom", "gateway"]:
        port = t.ports[name] = free_port()
        assert cmd[cmd.index("--port") + 1] == "8000", cmd
        cmd[cmd.index("--port") + 1] = str(port)
        env = t.environ(service)
        procs[name] = Process(cmd, env, ROOT, logs / f"{name}.log")
        check = [part.replace("127.0.0.1:8000", f"127.0.0.1:{port}")
                 for part in service.spec["healthcheck"]["test"][1:]]
        healthcheck(service, check, env, procs[name])
    elif cmd[:2] == ["voxroom", "worker"]:
        port = t.ports[name] = free_port()
        procs[name] = Process([t.path(part) for part in cmd],
                              t.environ(service, VOXROOM_WORKER_METRICS_PORT=str(port)), ROOT, logs / f"{name}.log")
        deadline = time.monotonic() + START_S
        while "ready:" not in procs[name].log_text():
            assert procs[name].alive() and time.monotonic() < deadline, procs[name].log_text()[-3000:]
            time.sleep(0.1)
    elif name == "nginx":
        port = t.ports[name] = free_port()
        assert service.environment["NGINX_LISTEN"] == "80"
        env = {k: t.host(v) for k, v in service.environment.items()} | {"NGINX_LISTEN": f"127.0.0.1:{port}"}
        prefix = t.tmp / "etc-nginx"
        prefix.mkdir()
        base = nginx_command(prefix, render_nginx(service, env, prefix))
        tested = subprocess.run([*base, "-t"], capture_output=True, text=True, timeout=10)
        assert tested.returncode == 0, tested.stderr
        procs[name] = Process(base, {"PATH": os.environ.get("PATH", "")}, prefix, logs / f"{name}.log")
        deadline = time.monotonic() + START_S
        while not answers(f"http://127.0.0.1:{port}/nginx-health"):
            assert procs[name].alive() and time.monotonic() < deadline, procs[name].log_text()[-3000:]
            time.sleep(0.1)
    else:
        raise AssertionError(f"no translation for service {name}")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    from workers.engines.chattts import random_checkpoint

    services = load_services()
    t = Translation(tmp_path_factory.mktemp("compose-stack"))
    (t.tmp / "logs").mkdir()
    (t.tmp / "home").mkdir()
    # The worker's mount: ./models on the host is /models in the container.
    (mount,) = [v for v in services["worker-gpu0"].spec["volumes"] if v.split(":")[1] == "/models"]
    chattts_dir = services["worker-gpu0"].command[services["worker-gpu0"].command.index("--chattts-dir") + 1]
    random_checkpoint.build(Path(t.path(chattts_dir)), "tiny", seed=0)
    assert mount.split(":")[0] == "./models"
    procs: dict[str, Process] = {}
    try:
        for name in start_order(services):
            start(services[name], t, procs)
        yield Stack(services, t, procs)
    finally:
        for name in reversed(list(procs)):
            procs[name].stop()


def test_services_start_in_the_order_of_their_depends_on() -> None:
    order = start_order(load_services())
    assert order.index("redis") < order.index("gateway-1") < order.index("nginx")
    assert order.index("redis") < order.index("worker-gpu0")


async def test_readyz_through_nginx_counts_the_worker(stack: Stack) -> None:
    deadline = time.monotonic() + START_S
    while True:  # the gateways learn of the worker from its first heartbeat
        status, _, body = await asyncio.to_thread(http, f"{stack.url}/readyz", timeout=5)
        if status == 200 or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.2)
    assert status == 200, body
    ready = json.loads(body)
    assert ready["status"] == "ready" and ready["workers"] == 1, ready


async def test_the_demo_page_and_the_client_module_through_nginx(stack: Stack) -> None:
    status, headers, body = await asyncio.to_thread(http, f"{stack.url}/")
    assert status == 200 and headers["content-type"].startswith("text/html"), (status, headers)
    assert b"voxroom" in body.lower()
    status, headers, body = await asyncio.to_thread(http, f"{stack.url}/client/voxroom.js")
    assert status == 200 and "javascript" in headers["content-type"], (status, headers)
    assert b"export" in body


async def test_a_room_through_nginx_hears_lines_from_the_batching_worker(stack: Stack, room: str) -> None:
    # The compose file sets VOXROOM_JWT_SECRET: no token, no room.
    async with websockets.connect(f"ws://127.0.0.1:{stack.translation.ports['nginx']}/rooms/{room}/ws") as bare:
        with pytest.raises(websockets.ConnectionClosed):
            await asyncio.wait_for(bare.recv(), 10)
        assert bare.close_code == 1008, (bare.close_code, bare.close_reason)

    token = await asyncio.to_thread(stack.token, room)
    client = RoomClient(stack.translation.ports["nginx"], room)
    client.url += f"?token={token}"
    async with client:
        for line in LINES:
            await client.say(line, voice=CHATTTS_VOICE)
        ends = await client.wait_ends(len(LINES), timeout=90)
    assert [e["status"] for e in ends] == ["ok"] * len(LINES), ends
    starts = client.got.of("start")
    assert [s["voice"] for s in starts] == [CHATTTS_VOICE] * len(LINES)
    # Each line: its start, its frames in order, its end.
    utterances = [e["utterance"] for e in ends]
    assert [s["utterance"] for s in starts] == utterances
    events = [(m.seq, "audio") if isinstance(m, AudioFrame) else (m["utterance"], m["type"])
              for m in client.got.stream if isinstance(m, AudioFrame) or m.get("type") in ("start", "end")]
    for end in ends:
        mine = [kind for utterance, kind in events if utterance == end["utterance"]]
        assert mine == ["start", *["audio"] * end["chunks"], "end"], (end, mine[:3], mine[-3:])
        assert [f.chunk for f in client.got.frames_of(end["utterance"])] == list(range(end["chunks"]))
    # Random weights end a line wherever their end-of-speech token falls: the energy and length
    # are those of the lines together.
    audio = np.concatenate([client.got.audio(n) for n in utterances]).astype(np.float64) / 32768
    assert audio.size / ROOM_RATE > 0.5, audio.size
    assert dbfs(rms(audio)) > SILENCE_DBFS, "the worker's engine sent silence"


async def test_lines_of_several_rooms_at_once_all_play(stack: Stack, room: str) -> None:
    """Five rooms at once on the service's worker (ChatTTS, continuous batching by default, up to
    VOXROOM_CHATTTS_MAX_BATCH rows): every line plays, in its room's order."""
    rooms = [f"{room}-{i}" for i in range(5)]
    port = stack.translation.ports["nginx"]
    tokens = [await asyncio.to_thread(stack.token, r) for r in rooms]
    clients = [RoomClient(port, r) for r in rooms]
    for client, token in zip(clients, tokens, strict=True):
        client.url += f"?token={token}"
        await client.__aenter__()
    try:
        await asyncio.gather(*(c.say(f"Room {i} is ready.", voice=CHATTTS_VOICE) for i, c in enumerate(clients)))
        ends = await asyncio.gather(*(c.wait_ends(1, timeout=90) for c in clients))
    finally:
        for client in clients:
            await client.__aexit__(None, None, None)
    for client, (end,) in zip(clients, ends, strict=True):
        assert end["status"] == "ok", end
        assert [f.chunk for f in client.got.frames_of(end["utterance"])] == list(range(end["chunks"]))
    # Random weights end a line wherever their end-of-speech token falls (one took 80 ms, all of it
    # fade): the energy is that of the rooms' audio together.
    together = np.concatenate([c.got.audio(e["utterance"]) for c, (e,) in zip(clients, ends, strict=True)])
    assert dbfs(rms(together.astype(np.float64) / 32768)) > SILENCE_DBFS


async def test_the_speech_api_through_nginx_answers_decodable_audio(stack: Stack) -> None:
    import av

    token = await asyncio.to_thread(stack.token, "_api")
    # The OpenAI SDK's request: its default format (mp3) and one of its voice names ("echo", a
    # Piper voice in the catalog: the worker serves the offline voices beside ChatTTS, and Piper's
    # real speech does not end where random weights happen to).
    status, headers, body = await asyncio.to_thread(
        http, f"{stack.url}/v1/audio/speech", timeout=90,
        data=json.dumps({"model": "tts-1", "input": LINE, "voice": "echo"}).encode(),
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"})
    assert status == 200, body[:300]
    assert headers["content-type"] == "audio/mpeg", headers
    with av.open(io.BytesIO(body), "r") as container:
        (stream,) = container.streams.audio
        pcm = np.concatenate([frame.to_ndarray().reshape(-1) for frame in container.decode(stream)])
        rate = stream.rate
    assert pcm.size / rate > 0.5, pcm.size
    assert dbfs(rms(pcm.astype(np.float64))) > SILENCE_DBFS


async def test_the_worker_serves_its_metrics_on_the_port_the_service_exposes(stack: Stack) -> None:
    worker = stack.services["worker-gpu0"]
    assert worker.spec["expose"] == [str(Settings().worker_metrics_port)]
    port = stack.translation.ports["worker-gpu0"]
    status, _, body = await asyncio.to_thread(http, f"http://127.0.0.1:{port}/metrics", timeout=10)
    assert status == 200
    (info,) = [line for line in body.decode().splitlines() if line.startswith("voxroom_worker_info{")]
    assert "chattts" in info, info
