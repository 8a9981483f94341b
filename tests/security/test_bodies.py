"""Huge request bodies over a live gateway: refused with 413 and never buffered.

Once, ``POST /v1/voices/search`` read the whole body before its 8 KiB check: a 200 MB body raised
the gateway's memory by 345 MB before the 413. Here 200 MB is offered three ways (an honest
``Content-Length``, chunked with none, and a ``Content-Length`` that lies about what follows) to
both endpoints that read bodies, over a raw socket that keeps sending until the gateway answers or
hangs up; the gateway's peak RSS (VmHWM) must not grow by more than a fraction of it.
"""

from __future__ import annotations

import json
import select
import socket
import time
from collections.abc import Iterator

import pytest

from tests.conftest import Stack
from tests.support.gauges import peak_rss_mib, rss_mib
from tests.support.processes import Proc, start_gateway

BODY_BYTES = 200 * 1024 * 1024
PIECE = b"x" * 65536
GROWTH_LIMIT_MIB = 48.0
"""What the gateway may grow by while refusing 200 MB (the old code grew by 345 MB)."""


@pytest.fixture(scope="module")
def gateway(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, int]]:
    proc, port = start_gateway(stack.redis_url, tmp_path_factory.mktemp("bodies-gateway"))
    try:
        yield proc, port
    finally:
        proc.stop()


def _status(response: bytes) -> int | None:
    if not response.startswith(b"HTTP/1.1 "):
        return None
    return int(response[9:12])


def post_huge(port: int, path: str, framing: str, timeout: float = 60.0) -> tuple[int | None, bytes, int]:
    """POST 200 MB of body to ``path``: ``framing`` is ``length`` (honest Content-Length),
    ``chunked``, or ``lying`` (a Content-Length of 4 KiB, its answer read, then 200 MB anyway: the
    status returned is the answer to the 4 KiB). Keeps sending until
    the server has answered, hung up, or everything is sent; returns the status, the response
    bytes, and how many body bytes went out."""
    headers = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Content-Type: application/json"]
    if framing == "length":
        headers.append(f"Content-Length: {BODY_BYTES}")
    elif framing == "lying":
        headers.append("Content-Length: 4096")
    else:
        headers.append("Transfer-Encoding: chunked")
    piece = b"%x\r\n%s\r\n" % (len(PIECE), PIECE) if framing == "chunked" else PIECE
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    response = b""
    sent = 0
    deadline = time.monotonic() + timeout
    response_head = b""
    try:
        sock.sendall(("\r\n".join(headers) + "\r\n\r\n").encode())
        if framing == "lying":
            # The declared 4 KiB first, and its answer read before the rest follows. Were the rest
            # already on its way, the gateway's close (unread bytes in its socket) would send a
            # reset that can discard the answer in our receive buffer before we read it (the race
            # RFC 9112 section 9.6 describes): a machine-speed coin toss, not the gateway's doing.
            sock.sendall(PIECE[:4096])
            sent = 4096
            while b"\r\n\r\n" not in response and time.monotonic() < deadline:
                data = sock.recv(65536)
                if not data:
                    break
                response += data
            response_head = response
            response = b""
        sock.setblocking(False)
        hung_up = False
        while sent < BODY_BYTES and not hung_up and b"\r\n\r\n" not in response:
            assert time.monotonic() < deadline, "the gateway neither answered nor hung up"
            readable, writable, _ = select.select([sock], [sock], [], 1.0)
            if readable:
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                hung_up = not data
                response += data
            elif writable:
                try:
                    sent += sock.send(piece)
                except (BrokenPipeError, ConnectionResetError):
                    hung_up = True
        sock.setblocking(True)
        sock.settimeout(10)
        # The rest of the response (it is small), unless the gateway reset the connection.
        while b"\r\n\r\n" in response and len(response) < 65536:
            try:
                data = sock.recv(65536)
            except (ConnectionResetError, TimeoutError):
                break
            if not data:
                break
            response += data
    finally:
        sock.close()
    if framing == "lying":
        # The answer is the one to the declared body; what followed is no HTTP request.
        response = response_head
    return _status(response), response, sent


@pytest.mark.parametrize("path", ["/v1/voices/search", "/v1/audio/speech"])
@pytest.mark.parametrize("framing", ["length", "chunked", "lying"])
def test_a_200_mb_body_is_refused_without_being_buffered(gateway: tuple[Proc, int], path: str,
                                                         framing: str) -> None:
    proc, port = gateway
    before_rss, before_peak = rss_mib(proc.pid), peak_rss_mib(proc.pid)
    status, response, sent = post_huge(port, path, framing)
    growth = peak_rss_mib(proc.pid) - max(before_rss, before_peak)
    print(f"\n{path} {framing}: answered {status} after {sent / 2**20:.1f} MiB sent; "
          f"RSS {before_rss:.0f} MiB -> {rss_mib(proc.pid):.0f} MiB, peak grew {max(growth, 0):.1f} MiB")
    if framing == "lying":
        # 4 KiB of body is read (not JSON: 400); what follows is no HTTP request: the connection ends.
        assert status == 400, response[:300]
    else:
        assert status == 413, response[:300]
        body = response.split(b"\r\n\r\n", 1)[1]
        assert json.loads(body)["error"]["code"] == "too_large"
        assert b"connection: close" in response.lower()
    assert sent < BODY_BYTES, "the gateway read all 200 MB before answering"
    assert growth < GROWTH_LIMIT_MIB
    assert proc.alive()
    log = proc.log_text()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log[-3000:]


@pytest.mark.parametrize("path", ["/v1/voices/search", "/v1/audio/speech"])
def test_a_body_nested_deeper_than_the_json_decoder_recurses_is_400(gateway: tuple[Proc, int], path: str) -> None:
    # Under the 8 KiB cap, 4 000 levels of nesting: json.loads raises RecursionError, not ValueError.
    proc, port = gateway
    body = b"[" * 4000 + b"]" * 4000
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        response = b""
        while data := sock.recv(65536):
            response += data
    assert _status(response) == 400, response[:300]
    assert json.loads(response.split(b"\r\n\r\n", 1)[1])["error"]["code"] == "bad_json"
    assert "Traceback" not in proc.log_text()
