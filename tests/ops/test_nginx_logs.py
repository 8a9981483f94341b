"""The shipped nginx never writes a room token to its access log, on the plain site and the TLS site.

Before, nginx's default ``combined`` format logged ``"GET /rooms/village/ws?token=eyJhbGci…" 101`` for
every room socket (the gateways already redacted theirs), and the full Referer of what a page opened
with ``?token=`` loads. Real nginx on the shipped files, real gateways, a real WebSocket client; the log
read is nginx's stdout, where ``nginx.conf`` sends the access log (what ``docker logs`` shows).
"""

from __future__ import annotations

import asyncio
import ssl
import uuid
from pathlib import Path

import httpx
import websockets

from tests.ops.conftest import OpsStack
from tests.ops.test_nginx import running_nginx
from tests.support.tls_edge import make_certificates, running_tls_nginx


def _markers() -> dict[str, str]:
    return {name: f"{name}-{uuid.uuid4().hex}" for name in ("wstoken", "apitoken", "referertoken")}


async def _visit(base_http: str, base_ws: str, room: str, marks: dict[str, str],
                 context: ssl.SSLContext | None) -> None:
    """A room socket with a token, an API call with one, and a client module fetched by a page whose
    URL held one (its Referer)."""
    url = f"{base_ws}/rooms/{room}/ws?token={marks['wstoken']}&client=logcheck"
    async with websockets.connect(url, ssl=context, open_timeout=10) as ws:
        await asyncio.wait_for(ws.recv(), 10)  # welcome (or whatever the gateway says): it went through
    verify: ssl.SSLContext | bool = context if context is not None else False
    async with httpx.AsyncClient(base_url=base_http, verify=verify, timeout=10) as http:
        assert (await http.get(f"/v1/voices?token={marks['apitoken']}")).status_code == 200
        page = f"{base_http}/?room={room}&token={marks['referertoken']}"
        assert (await http.get("/client/voxroom.js", headers={"Referer": page})).status_code == 200


async def _logged(log: Path, needle: str) -> str:
    """The access log once it holds ``needle`` (a WebSocket is logged when it closes)."""
    def read() -> str:
        return log.read_text(errors="replace") if log.exists() else ""

    for _ in range(200):
        text = await asyncio.to_thread(read)
        if needle in text:
            return text
        await asyncio.sleep(0.05)
    raise AssertionError(f"{needle!r} never logged:\n{text[-2000:]}")


def _check(text: str, room: str, base_http: str, marks: dict[str, str]) -> None:
    leaked = [name for name, mark in marks.items() if mark in text]
    assert not leaked, f"in the access log: {leaked}\n{text[-2000:]}"
    assert f'"GET /rooms/{room}/ws HTTP/1.1" 101 ' in text
    assert ' "-" "Python/' in text, "no Referer: '-', as in nginx's combined format"
    assert '"GET /v1/voices HTTP/' in text
    assert f'"{base_http}/" ' in text, "the Referer is kept, without its query"


async def test_the_plain_site_logs_paths_without_tokens(ops_stack: OpsStack, tmp_path: Path, room: str) -> None:
    marks = _markers()
    with running_nginx(tmp_path, [p for _, p in ops_stack.gateways]) as port:
        base = f"http://127.0.0.1:{port}"
        await _visit(base, f"ws://127.0.0.1:{port}", room, marks, None)
        text = await _logged(tmp_path / "stdout.log", f"/rooms/{room}/ws")
        text = await _logged(tmp_path / "stdout.log", "/client/voxroom.js")
    _check(text, room, base, marks)


async def test_the_tls_site_logs_paths_without_tokens(ops_stack: OpsStack, tmp_path: Path, room: str) -> None:
    marks = _markers()
    certs = make_certificates(tmp_path / "certs")
    with running_tls_nginx(tmp_path / "nginx", [p for _, p in ops_stack.gateways], certs) as edge:
        base = f"https://localhost:{edge.https_port}"
        await _visit(base, f"wss://localhost:{edge.https_port}", room, marks, certs.client_context())
        text = await _logged(edge.shipped_log, f"/rooms/{room}/ws")
        text = await _logged(edge.shipped_log, "/client/voxroom.js")
    _check(text, room, base, marks)
