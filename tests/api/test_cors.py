"""CORS at a real gateway: which origins a page may use the client modules and the HTTP API from.

Two gateways on the session's Redis (its worker speaks for them): one with an allow-list, one
with none (any origin). Requests are what a browser sends: preflights (``OPTIONS`` with
``Access-Control-Request-Method``) and simple requests with an ``Origin``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Stack
from tests.support.processes import Proc, start_gateway
from tests.support.ws_clients import connect, next_json, refusal, ws_url
from voxroom.wire.protocol import CloseCode

GAME = "https://game.example"
EDITOR = "http://localhost:5173"
UNLISTED = ("https://evil.example", "null", "https://game.example.evil.example", "http://game.example",
            "https://game.example:8443")
LINE = "The gate opens at dawn."


@pytest.fixture(scope="module")
def listed(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A gateway that lets in two origins (WebSocket and CORS alike)."""
    gateway, port = start_gateway(stack.redis_url, tmp_path_factory.mktemp("cors-listed"),
                                  VOXROOM_ALLOWED_ORIGINS=f"{GAME}, {EDITOR}")
    yield from _stopping(gateway, port)


@pytest.fixture(scope="module")
def open_gateway(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A gateway with no allow-list: any origin."""
    gateway, port = start_gateway(stack.redis_url, tmp_path_factory.mktemp("cors-open"))
    yield from _stopping(gateway, port)


def _stopping(gateway: Proc, port: int) -> Iterator[int]:
    try:
        yield port
    finally:
        gateway.stop()


def http(port: int) -> httpx.Client:
    return httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)


def preflight(port: int, path: str, origin: str, method: str = "POST", **extra: str) -> httpx.Response:
    headers = {"Origin": origin, "Access-Control-Request-Method": method, **extra}
    with http(port) as client:
        return client.options(path, headers=headers)


def cors_headers(resp: httpx.Response) -> dict[str, str]:
    return {k: v for k, v in resp.headers.items() if k.startswith("access-control-")}


def vary(resp: httpx.Response) -> set[str]:
    return {part.strip().lower() for part in resp.headers.get("vary", "").split(",") if part.strip()}


def test_a_listed_origin_may_post_speech_after_its_preflight(listed: int) -> None:
    for origin in (GAME, EDITOR):
        resp = preflight(listed, "/v1/audio/speech", origin,
                         **{"Access-Control-Request-Headers": "authorization, content-type, x-stainless-lang"})
        assert resp.status_code == 200, (origin, resp.status_code, resp.text)
        assert resp.headers["access-control-allow-origin"] == origin
        assert "POST" in resp.headers["access-control-allow-methods"].split(", ")
        # Mirrored, so that a bearer token and a JSON body (and OpenAI's SDK headers) get through.
        assert resp.headers["access-control-allow-headers"] == "authorization, content-type, x-stainless-lang"
        assert "access-control-allow-credentials" not in resp.headers, "no cookies cross-origin"
        assert "origin" in vary(resp)
    with http(listed) as client:
        resp = client.post("/v1/audio/speech", headers={"Origin": GAME},
                           json={"model": "tts-1", "input": LINE, "voice": "en-espeak", "response_format": "wav"})
    assert resp.status_code == 200, resp.text[:300]
    assert resp.content[:4] == b"RIFF" and len(resp.content) > 44 + 16000, "a whole line of audio"
    assert resp.headers["access-control-allow-origin"] == GAME
    exposed = {h.strip().lower() for h in resp.headers["access-control-expose-headers"].split(",")}
    assert {"retry-after", "x-voxroom-voice"} <= exposed, "the page may read which voice spoke and when to retry"
    assert resp.headers["x-voxroom-voice"] == "en-espeak"


def test_an_unlisted_origin_is_refused_its_preflight_and_gets_no_cors_header(listed: int) -> None:
    for origin in UNLISTED:
        for path, method in (("/v1/audio/speech", "POST"), ("/v1/voices", "GET"), ("/client/voxroom.js", "GET")):
            resp = preflight(listed, path, origin, method)
            assert resp.status_code == 403, (origin, path, resp.status_code)
            assert cors_headers(resp) == {}, (origin, path)
    # Simple requests are still served (a server cannot stop a GET), but a browser hides the answer.
    with http(listed) as client:
        for path in ("/v1/voices", "/client/voxroom.js"):
            resp = client.get(path, headers={"Origin": "https://evil.example"})
            assert resp.status_code == 200, path
            assert cors_headers(resp) == {}, path
            assert "origin" in vary(resp), "a cache must not give this answer to a listed origin"


def test_the_catalog_and_the_client_modules_carry_the_listed_origin(listed: int) -> None:
    with http(listed) as client:
        voices = client.get("/v1/voices", headers={"Origin": GAME})
        assert voices.status_code == 200 and voices.json()["voices"], voices.text[:300]
        assert voices.headers["access-control-allow-origin"] == GAME
        # What `import('http://gateway/client/voxroom.js')` fetches: the module, the modules it
        # imports, and the AudioWorklet module (also fetched in CORS mode).
        for module in ("voxroom.js", "protocol.js", "player.js", "worklet.js", "jitter.js"):
            resp = client.get(f"/client/{module}", headers={"Origin": EDITOR})
            assert resp.status_code == 200, module
            assert "javascript" in resp.headers["content-type"], module
            assert resp.headers["access-control-allow-origin"] == EDITOR, module
            assert "origin" in vary(resp), module
        # Without an Origin (a server, curl) nothing changes but Vary.
        plain = client.get("/v1/voices")
        assert plain.status_code == 200 and cors_headers(plain) == {}
    for path in ("/v1/voices", "/v1/voices/search", "/v1/models", "/v1/audio/voices"):
        resp = preflight(listed, path, GAME, "POST" if path.endswith("search") else "GET")
        assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == GAME, path


def test_operator_endpoints_stay_same_origin(listed: int) -> None:
    for path in ("/metrics", "/readyz", "/healthz", "/"):
        resp = preflight(listed, path, GAME, "GET")
        assert resp.status_code == 405, (path, resp.status_code)
        assert cors_headers(resp) == {}, path
    with http(listed) as client:
        resp = client.get("/healthz", headers={"Origin": GAME})
    assert resp.status_code == 200 and cors_headers(resp) == {}


def test_without_a_list_any_origin_is_answered_with_a_star_but_never_into_a_private_network(
        listed: int, open_gateway: int) -> None:
    for origin in (GAME, "https://evil.example", "null"):
        resp = preflight(open_gateway, "/v1/audio/speech", origin, **{"Access-Control-Request-Headers": "content-type"})
        assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == "*", origin
        assert "access-control-allow-credentials" not in resp.headers
    with http(open_gateway) as client:
        resp = client.get("/client/voxroom.js", headers={"Origin": "https://evil.example"})
    assert resp.status_code == 200 and resp.headers["access-control-allow-origin"] == "*"
    # A public page reaching a gateway on a private address (Chromium's Private Network Access):
    # only for a listed origin.
    pna = {"Access-Control-Request-Private-Network": "true"}
    refused = preflight(open_gateway, "/v1/voices", GAME, "GET", **pna)
    assert refused.status_code >= 400 and "access-control-allow-private-network" not in refused.headers
    allowed = preflight(listed, "/v1/voices", GAME, "GET", **pna)
    assert allowed.status_code == 200
    assert allowed.headers["access-control-allow-private-network"] == "true"
    assert allowed.headers["access-control-allow-origin"] == GAME


async def test_the_websocket_origin_check_is_unchanged(listed: int, room: str) -> None:
    for origin in ("https://evil.example", "http://game.example"):
        assert await refusal(ws_url(listed, room), origin=origin) == (CloseCode.POLICY_VIOLATION,
                                                                     "origin not allowed"), origin
    for allowed in (GAME, None):
        ws = await connect(ws_url(listed, room), origin=allowed)
        try:
            assert (await next_json(ws, kind="welcome"))["room"] == room
        finally:
            await asyncio.wait_for(ws.close(), 10)
