"""TLS and HTTP/2 at the edge: the shipped nginx with docker-compose.tls.yml's layout, a throwaway CA,
real gateways and a synthetic worker behind it (tests/support/tls_edge.py). An HTTP/2 client makes many
speech calls on one connection; a WebSocket client joins a room over wss:// and hears a line.
Chromium does the same from an HTTPS page in tests/browser/tls.e2e.test.mjs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import websockets

from tests.ops.conftest import OpsStack
from tests.ops.test_nginx import SUFFIX, TEMPLATES, VARIABLES, compose_nginx, template_variables
from tests.support.audio import SILENCE_DBFS, dbfs, rms
from tests.support.processes import ROOT
from tests.support.room_client import RoomClient
from tests.support.tls_edge import (
    TLS_TEMPLATES,
    TLS_VARIABLES,
    Certificates,
    Edge,
    compose_tls,
    make_certificates,
    running_tls_nginx,
    template_layout,
    volumes,
)
from tests.support.waiting import scaled
from voxroom.wire.protocol import ROOM_RATE
from workers.engines.synthetic import SyntheticEngine

SPEECH_CALLS = 6
LINE = "Over TLS, the torches are lit along the wall."


def assert_is_the_line(audio: np.ndarray, text: str) -> None:
    """The synthetic worker's audio for ``text``: as long as the engine makes that text (its length
    follows the text), and not silence."""
    seconds, expected = audio.size / ROOM_RATE, SyntheticEngine().duration_s(text)
    assert abs(seconds - expected) < 0.25, (seconds, expected, text)
    assert dbfs(rms(audio)) > SILENCE_DBFS


def test_tls_template_uses_only_the_documented_variables() -> None:
    templates = sorted(TLS_TEMPLATES.rglob(f"*{SUFFIX}"))
    assert templates, "nginx/tls/ holds the TLS site"
    used = set().union(*(template_variables(t.read_text()) for t in templates))
    assert used == set(TLS_VARIABLES)
    deployment = (ROOT / "docs" / "deployment.md").read_text()
    assert [v for v in TLS_VARIABLES if f"`{v}`" not in deployment] == []


def test_compose_tls_file_renders_the_plain_site_and_the_tls_site_and_sets_every_variable() -> None:
    nginx = compose_tls()
    # The plain site as docker-compose.yml mounts it (nginx/templates/voxroom/), plus nginx/tls/.
    assert template_layout() == {"voxroom": TEMPLATES / "voxroom", "voxroom-tls": TLS_TEMPLATES}
    assert sorted(p.name for p in TEMPLATES.iterdir()) == ["voxroom"], "every plain template is in the layout"
    env = {k: str(v) for k, v in nginx["environment"].items()}
    assert set(env) == {*TLS_VARIABLES, "NGINX_ENVSUBST_TEMPLATE_DIR"}
    # The base service sets the plain site's variables; together, every variable a template names.
    base, _ = compose_nginx()
    assert set(base["environment"]) | set(env) >= {*VARIABLES, *TLS_VARIABLES}
    assert {p.split(":")[-1] for p in nginx["ports"]} == {env["NGINX_TLS_LISTEN"]}
    # The default certificate paths lie in the mounted certificate directory.
    (cert_dir,) = [target for source, target in volumes(nginx) if source.startswith("${VOXROOM_TLS_DIR")]
    for name in ("NGINX_TLS_CERT", "NGINX_TLS_KEY"):
        default = env[name].partition(":-")[2].rstrip("}")
        assert default.startswith(cert_dir + "/"), (name, default)
    for source, target in volumes(nginx):
        if source.startswith("./"):
            assert (ROOT / source).is_dir(), (source, target)


async def logged(edge: Edge, uri_prefix: str, count: int) -> list[dict[str, str]]:
    """The access log entries for ``uri_prefix`` once there are ``count`` (nginx writes one when a
    request ends, a WebSocket's when it closes: a moment after the client saw the end)."""
    deadline = time.monotonic() + scaled(30)
    while time.monotonic() < deadline:
        entries = edge.connections(uri_prefix)
        if len(entries) >= count:
            return entries
        await asyncio.sleep(0.05)
    return edge.connections(uri_prefix)  # fewer: the caller's assertion says what was logged


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls-certs"))


@pytest.fixture
def edge(ops_stack: OpsStack, certs: Certificates, tmp_path: Path) -> Iterator[Edge]:
    with running_tls_nginx(tmp_path, [p for _, p in ops_stack.gateways], certs) as running:
        yield running


async def test_http2_carries_many_speech_calls_on_one_connection(edge: Edge, certs: Certificates) -> None:
    # Lines of different lengths: each response is its own line's audio.
    lines = [f"Line {n}:" + " The caravan reaches the river." * (n + 1) for n in range(SPEECH_CALLS)]
    async with httpx.AsyncClient(base_url=f"https://localhost:{edge.https_port}", http2=True,
                                 verify=certs.client_context(), timeout=60) as http:
        responses = [await http.post("/v1/audio/speech", json={"input": lines[0], "voice": "alloy",
                                                                "response_format": "pcm"})]
        # The rest at once: HTTP/2 multiplexes them as streams of the connection already open.
        responses += await asyncio.gather(*(http.post("/v1/audio/speech", json={
            "input": line, "voice": "alloy", "response_format": "pcm"}) for line in lines[1:]))
    for line, resp in zip(lines, responses, strict=True):
        assert (resp.status_code, resp.http_version) == (200, "HTTP/2"), resp.text[:200]
        assert_is_the_line(np.frombuffer(resp.content, dtype="<i2").astype(np.float64) / 32768, line)
    # nginx's own record: every call on one TLS connection, spoken as HTTP/2.
    calls = await logged(edge, "/v1/audio/speech", SPEECH_CALLS)
    assert {(c["connection"], c["server_protocol"], c["status"]) for c in calls} == {(calls[0]["connection"],
                                                                                      "HTTP/2.0", "200")}


async def test_a_room_over_wss_hears_a_line(edge: Edge, certs: Certificates, room: str) -> None:
    client = RoomClient(edge.https_port, room, host="localhost")
    client.url = client.url.replace("ws://", "wss://", 1)
    # RoomClient's own connect has no TLS context: connect here, then let it read as usual.
    client.ws = await websockets.connect(client.url, ssl=certs.client_context(), max_size=2**20)
    client._reader = asyncio.create_task(client._read(), name=f"test-client:{client.url}")
    try:
        await client.wait_for(lambda g: bool(g.of("welcome")), 10)
        await client.say(LINE)
        ends = await client.wait_ends(1, timeout=30)
    finally:
        await client.__aexit__(None, None, None)
    (end,) = ends
    assert end["status"] == "ok", end
    frames = client.got.frames_of(end["utterance"])
    assert [f.chunk for f in frames] == list(range(end["chunks"])) and frames
    assert_is_the_line(client.got.audio(end["utterance"]).astype(np.float64) / 32768, LINE)
    # The upgrade went through the TLS listener, on HTTP/1.1 (nginx has no WebSockets over HTTP/2).
    (upgrade,) = await logged(edge, f"/rooms/{room}/ws", 1)
    assert (upgrade["server_protocol"], upgrade["status"], upgrade["ssl_protocol"]) == ("HTTP/1.1", "101", "TLSv1.3")

