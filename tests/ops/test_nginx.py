"""Real nginx (the Debian package) in front of two real gateways, configured from ``nginx/``.

The site file ``nginx/voxroom.conf`` and the upstream block of ``nginx/upstreams.conf`` are used
as they are; only what must differ outside a container is rewritten: the listen address, the
gateway addresses, and every path (pid, logs, temp files) moved into a temporary prefix so that
nginx needs no root and no /var.
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

import pytest

from tests.ops.conftest import OpsStack
from tests.ops.test_metrics import scrape, value
from tests.support.processes import ROOT, start_gateway
from tests.support.room_client import RoomClient
from voxroom.redis_server import free_port

NGINX_DIR = ROOT / "nginx"


def render(prefix: Path, port: int, gateways: list[int]) -> Path:
    site = (NGINX_DIR / "voxroom.conf").read_text()
    site, n = re.subn(r"^(\s*)listen 80;", rf"\1listen 127.0.0.1:{port};", site, flags=re.M)
    assert n == 1, "voxroom.conf should have one `listen 80;`"
    upstreams = (NGINX_DIR / "upstreams.conf").read_text()
    servers = "".join(f"    server 127.0.0.1:{p} max_fails=2 fail_timeout=10s;\n" for p in gateways)
    upstreams, n = re.subn(r"(?:^\s*server \S+:8000[^\n]*\n)+", servers, upstreams, flags=re.M)
    assert n == 1, "upstreams.conf should list its gateways as consecutive `server name:8000` lines"
    (prefix / "upstreams.conf").write_text(upstreams)
    (prefix / "voxroom.conf").write_text(site)
    temps = "\n".join(f"    {kind}_temp_path {prefix}/{kind}_temp;"
                      for kind in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    conf = prefix / "nginx.conf"
    conf.write_text(f"""daemon off;
worker_processes 1;
pid {prefix}/nginx.pid;
error_log {prefix}/error.log info;
events {{ worker_connections 1024; }}
http {{
    access_log {prefix}/access.log;
{temps}
    include {prefix}/upstreams.conf;
    include {prefix}/voxroom.conf;
}}
""")
    return conf


@contextlib.contextmanager
def running_nginx(prefix: Path, gateways: list[int]) -> Iterator[int]:
    """Debian's nginx on a free port in front of ``gateways``; stopped on exit."""
    binary = shutil.which("nginx") or "/usr/sbin/nginx"
    if not Path(binary).exists():
        pytest.fail("nginx is not installed: run scripts/system-deps (apt-get install nginx)")
    port = free_port()
    conf = render(prefix, port, gateways)
    base = [binary, "-e", str(prefix / "error.log"), "-p", str(prefix), "-c", str(conf)]
    check = subprocess.run([*base, "-t"], capture_output=True, text=True, timeout=10)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen(base, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/nginx-health", timeout=1):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nginx did not start: {(prefix / 'error.log').read_text()}") from None
                time.sleep(0.05)
        yield port
    finally:
        proc.terminate()  # SIGTERM: fast shutdown
        proc.wait(10)


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
