"""Real nginx (the Debian package) in front of two real gateways, configured from ``nginx/`` as shipped.

``nginx/nginx.conf`` is used byte for byte, and ``nginx/templates/`` is filled the way the official
nginx image's entrypoint fills it (GNU ``envsubst`` over each ``*.template``, into ``conf.d/``), with
the documented variables only: the listen address and the gateway addresses. What must differ outside
a container is given without editing a shipped file: ``-p``/``-c`` point nginx at a temporary prefix,
``-g`` sets the pid file, and a drop-in beside the rendered templates moves the temp paths there, so
that nginx needs no /var.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.ops.conftest import OpsStack
from tests.ops.test_metrics import scrape, value
from tests.support.processes import ROOT, start_gateway
from tests.support.room_client import RoomClient
from voxroom.store.server import free_port

NGINX_DIR = ROOT / "nginx"
TEMPLATES = NGINX_DIR / "templates"
SUFFIX = ".template"
# Every variable the templates use; docs/deployment.md documents each, docker-compose.yml sets each.
VARIABLES = ("NGINX_LISTEN", "NGINX_GATEWAY_1", "NGINX_GATEWAY_2")
# Where docker-compose.yml must mount the shipped files in the official image.
MOUNTS = {"./nginx/nginx.conf": "/etc/nginx/nginx.conf", "./nginx/templates": "/etc/nginx/templates"}


def template_variables(text: str) -> set[str]:
    """The environment variables a template names (envsubst's ``$NAME`` / ``${NAME}``; nginx's own
    variables are lower case)."""
    return set(re.findall(r"\$\{?([A-Z][A-Z0-9_]*)", text))


def envsubst(text: str, values: dict[str, str]) -> str:
    """What the image's 20-envsubst-on-templates.sh does to one template: GNU envsubst, told which
    variables to replace (the image passes every defined one; here they are the documented ones)."""
    binary = shutil.which("envsubst")
    if binary is None:
        pytest.fail("envsubst is not installed: run scripts/system-deps (apt-get install gettext-base)")
    shell_format = " ".join(f"${{{name}}}" for name in values)
    done = subprocess.run([binary, shell_format], input=text, env=values, capture_output=True, text=True,
                          timeout=10, check=True)
    return done.stdout


def render(prefix: Path, port: int, gateways: list[int]) -> Path:
    """The shipped files under ``prefix`` as the image lays them out under /etc/nginx."""
    assert len(gateways) == 2, "the shipped templates name two gateways"
    values = {"NGINX_LISTEN": f"127.0.0.1:{port}",
              **{f"NGINX_GATEWAY_{i}": f"127.0.0.1:{p}" for i, p in enumerate(gateways, 1)}}
    assert set(values) == set(VARIABLES)
    for template in sorted(TEMPLATES.rglob(f"*{SUFFIX}")):
        out = prefix / "conf.d" / template.relative_to(TEMPLATES).with_suffix("")
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(envsubst(template.read_text(), values))
    # The drop-in (nginx.conf includes conf.d/voxroom/*.conf): temp paths are http-level, -g cannot set them.
    temps = "".join(f"{kind}_temp_path {prefix}/{kind}_temp;\n"
                    for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    (prefix / "conf.d" / "voxroom" / "zz-test-paths.conf").write_text(temps)
    conf = prefix / "nginx.conf"
    shutil.copyfile(NGINX_DIR / "nginx.conf", conf)
    return conf


def nginx_command(prefix: Path, conf: Path) -> list[str]:
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        pytest.fail("nginx is not installed: run scripts/system-deps (apt-get install nginx)")
    # `daemon off;` is also how the official image starts nginx (its CMD).
    return [binary, "-e", str(prefix / "error.log"), "-p", f"{prefix}/", "-c", str(conf),
            "-g", f"daemon off; pid {prefix}/nginx.pid;"]


@contextlib.contextmanager
def running_nginx(prefix: Path, gateways: list[int]) -> Iterator[int]:
    """Debian's nginx on a free port in front of ``gateways``; stopped on exit."""
    port = free_port()
    base = nginx_command(prefix, render(prefix, port, gateways))
    check = subprocess.run([*base, "-t"], capture_output=True, text=True, timeout=10)
    assert check.returncode == 0, check.stderr
    stderr = prefix / "stderr.log"  # nginx.conf logs errors to stderr, as a container should
    # and its access log to stdout: prefix/stdout.log is the shipped access log, as `docker logs` shows it.
    with open(stderr, "wb") as sink, open(prefix / "stdout.log", "wb") as out:
        proc = subprocess.Popen(base, stdout=out, stderr=sink)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/nginx-health", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nginx did not start: {stderr.read_text()}") from None
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()  # SIGTERM: fast shutdown
        proc.wait(10)


def compose_nginx() -> tuple[dict[str, Any], set[str]]:
    """docker-compose.yml's nginx service and the gateway services (as ``name:8000``)."""
    services: dict[str, dict[str, Any]] = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    gateways = {f"{name}:8000" for name, s in services.items() if (s.get("command") or [])[1:2] == ["gateway"]}
    return services["nginx"], gateways


def test_templates_use_only_the_documented_variables() -> None:
    templates = sorted(TEMPLATES.rglob(f"*{SUFFIX}"))
    assert templates, "nginx/templates/ holds the site"
    used = set().union(*(template_variables(t.read_text()) for t in templates))
    assert used == set(VARIABLES)
    # nginx.conf is mounted as is (not a template): it must name no variable for envsubst.
    assert not template_variables((NGINX_DIR / "nginx.conf").read_text())
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    assert [v for v in VARIABLES if f"`{v}`" not in deployment] == []


def test_compose_mounts_the_shipped_layout_and_sets_every_variable() -> None:
    nginx, gateways = compose_nginx()
    image, _, tag = nginx["image"].partition(":")
    assert image == "nginx" and tuple(map(int, tag.split(".")[:2])) >= (1, 19), "templates need nginx:1.19+"
    mounts = {v.split(":")[0]: v.split(":")[1] for v in nginx["volumes"]}
    assert {k: mounts.get(k) for k in MOUNTS} == MOUNTS
    env = {k: str(v) for k, v in (nginx.get("environment") or {}).items()}
    assert set(env) == set(VARIABLES)
    # Every gateway service behind nginx, and nothing else.
    assert {v for k, v in env.items() if k.startswith("NGINX_GATEWAY_")} == gateways
    published = {p.split(":")[-1] for p in nginx["ports"]}
    assert published == {env["NGINX_LISTEN"]}


def test_shipped_files_pass_nginx_t_with_the_documented_substitutions(tmp_path: Path) -> None:
    """Nothing listens on the gateway ports: `nginx -t` only needs them to be addresses."""
    conf = render(tmp_path, free_port(), [free_port(), free_port()])
    rendered = "".join(p.read_text() for p in sorted((tmp_path / "conf.d").rglob("*.conf")))
    assert "${" not in rendered and "$NGINX" not in rendered
    check = subprocess.run([*nginx_command(tmp_path, conf), "-t"], capture_output=True, text=True, timeout=10)
    assert check.returncode == 0, check.stderr
    assert "test is successful" in check.stderr


@pytest.fixture
def nginx(ops_stack: OpsStack, tmp_path: Path) -> Iterator[int]:
    with running_nginx(tmp_path, [p for _, p in ops_stack.gateways]) as port:
        yield port


def http_status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return exc.code


async def test_room_through_nginx_with_room_affinity(nginx: int, ops_stack: OpsStack, room: str) -> None:
    assert await asyncio.to_thread(http_status, f"http://127.0.0.1:{nginx}/healthz") == 200
    assert await asyncio.to_thread(http_status, f"http://127.0.0.1:{nginx}/readyz") == 200
    assert await asyncio.to_thread(http_status, f"http://127.0.0.1:{nginx}/metrics") == 404

    def connections() -> list[float]:
        return [value(scrape(p), "voxroom_connections") for _, p in ops_stack.gateways]

    before = await asyncio.to_thread(connections)
    async with RoomClient(nginx, room) as speaker, RoomClient(nginx, room) as a, RoomClient(nginx, room) as b:
        during = await asyncio.to_thread(connections)
        # hash $room_id: all three clients of the room went to the same gateway.
        assert sorted(d - b0 for d, b0 in zip(during, before, strict=True)) == [0, 3], (before, during)
        await speaker.say("through nginx, with upgrade")
        for client in (speaker, a, b):
            ends = await client.wait_ends(1, timeout=20)
            assert ends[0]["status"] == "ok"
            frames = client.got.frames_of(ends[0]["utterance"])
            assert len(frames) == ends[0]["chunks"] > 0
            assert [f.chunk for f in frames] == list(range(len(frames)))


async def test_a_room_moves_to_the_other_gateway_when_its_gateway_dies(ops_stack: OpsStack, tmp_path: Path,
                                                                       room: str) -> None:
    """Passive failover: SIGKILL the room's gateway; a reconnect through nginx reaches the other one."""
    gateways = [start_gateway(ops_stack.redis_url, tmp_path) for _ in range(2)]
    try:
        with running_nginx(tmp_path, [p for _, p in gateways]) as port:
            async with RoomClient(port, room):
                counts = [value(await asyncio.to_thread(scrape, p), "voxroom_connections") for _, p in gateways]
                home = counts.index(1.0)
                gateways[home][0].kill()
            async with RoomClient(port, room) as again:
                await again.say("after failover")
                ends = await again.wait_ends(1, timeout=20)
                assert ends[0]["status"] == "ok" and again.got.frames_of(ends[0]["utterance"])
            other = gateways[1 - home][1]
            assert value(await asyncio.to_thread(scrape, other), "voxroom_utterances_accepted_total") == 1
    finally:
        for proc, _ in gateways:
            proc.stop()
