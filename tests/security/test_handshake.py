"""Half-open requests (slowloris) over a live gateway: closed at the header deadline.

uvicorn has no deadline on request headers: 1,500 half-open WebSocket upgrades all stayed open
after 60 s. With ``VOXROOM_HANDSHAKE_TIMEOUT_S`` the gateway closes a connection whose request
headers are not complete in time, and well-behaved clients are served as before.
"""

from __future__ import annotations

import selectors
import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.conftest import Stack
from tests.support.processes import Proc, start_gateway
from tests.support.ws_clients import QueryClient

# Short, and still long enough that the good clients beside the half-open ones (this test process,
# on a busy machine) always finish their headers within it.
HANDSHAKE_TIMEOUT_S = 2.0
HALF_OPEN = 200


@pytest.fixture(scope="module")
def gateway(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, int]]:
    proc, port = start_gateway(stack.redis_url, tmp_path_factory.mktemp("handshake-gateway"),
                               VOXROOM_HANDSHAKE_TIMEOUT_S=str(HANDSHAKE_TIMEOUT_S))
    try:
        yield proc, port
    finally:
        proc.stop()


def _closed_by_server(socks: list[socket.socket], timeout: float) -> int:
    """Wait until the server closed each socket (EOF or reset); how many it closed in ``timeout``."""
    selector = selectors.DefaultSelector()
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    closed = 0
    deadline = time.monotonic() + timeout
    try:
        while closed < len(socks) and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=1.0):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(4096)
                except ConnectionResetError:
                    data = b""
                if not data:
                    selector.unregister(sock)
                    closed += 1
    finally:
        selector.close()
    return closed


@pytest.mark.parametrize("partial", [
    b"GET /rooms/slow/ws HT",  # half a request line
    b"GET /rooms/slow/ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n",  # no blank line
    b"",  # nothing at all after the TCP handshake
])
async def test_half_open_requests_are_closed_and_a_normal_client_still_works(gateway: tuple[Proc, int],
                                                                             partial: bytes, room: str) -> None:
    proc, port = gateway
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(HALF_OPEN)]
    try:
        for sock in socks:
            if partial:
                sock.sendall(partial)
        # Generous: the deadline is 1 s; a busy machine may take a while to close 200 sockets.
        closed = _closed_by_server(socks, timeout=60.0)
    finally:
        for sock in socks:
            sock.close()
    assert closed == HALF_OPEN
    async with QueryClient(port, room) as client:
        assert client.got.of("welcome")
        await client.say("Still open for business.", seq=1)
        ends = await client.wait_ends(1, timeout=60)
        assert ends[0]["status"] == "ok"
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(f"http://127.0.0.1:{port}/healthz")).status_code == 200
    assert proc.alive()


def _get(sock: socket.socket, path: str) -> bytes:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    response = b""
    while b"\r\n\r\n" not in response or not response.endswith(b"}"):
        data = sock.recv(4096)
        assert data, f"closed mid-response: {response!r}"
        response += data
    return response


def test_the_deadline_covers_each_request_s_headers_not_the_connection_s_life(gateway: tuple[Proc, int]) -> None:
    _, port = gateway
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        assert _get(sock, "/healthz").startswith(b"HTTP/1.1 200")
        # Past the header deadline, within uvicorn's 5 s keep-alive: the next request is served.
        time.sleep(HANDSHAKE_TIMEOUT_S + 1.5)
        assert _get(sock, "/healthz").startswith(b"HTTP/1.1 200")
        # A later request on the same connection that never finishes its headers is cut too.
        sock.sendall(b"GET /heal")
        assert _closed_by_server([sock], timeout=60.0) == 1


UPGRADE = ("Host: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
           "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n")
OVERSIZED = 300


def _refused_total(port: int, reason: str) -> float:
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    line = f'voxroom_handshakes_refused_total{{reason="{reason}"}} '
    return sum(float(row[len(line):]) for row in text.splitlines() if row.startswith(line))


def _answers(socks: list[socket.socket], timeout: float) -> list[bytes]:
    """Everything each socket received until the server closed it; stops at ``timeout`` (a socket
    the server never closed keeps what it had, which the caller sees as no answer)."""
    selector = selectors.DefaultSelector()
    got = {sock.fileno(): b"" for sock in socks}
    for sock in socks:
        sock.setblocking(False)
        selector.register(sock, selectors.EVENT_READ)
    open_left = len(socks)
    deadline = time.monotonic() + timeout
    try:
        while open_left and time.monotonic() < deadline:
            for key, _ in selector.select(timeout=1.0):
                sock = key.fileobj
                assert isinstance(sock, socket.socket)
                try:
                    data = sock.recv(65536)
                except ConnectionResetError:
                    data = b""
                if data:
                    got[sock.fileno()] += data
                else:
                    selector.unregister(sock)
                    got[sock.fileno()] += b"<EOF>"
                    open_left -= 1
    finally:
        selector.close()
    return [got[sock.fileno()] for sock in socks]


@pytest.mark.parametrize(("what", "request_bytes", "status", "reason"), [
    ("a 9 KB request line", f"GET /rooms/big/ws?token={'a' * 9000} HTTP/1.1\r\n{UPGRADE}\r\n",
     b"414", "uri_too_long"),
    ("a 9 KB header line", f"GET /rooms/big/ws HTTP/1.1\r\n{UPGRADE}X-Big: {'a' * 9000}\r\n\r\n",
     b"431", "headers_too_large"),
    ("130 headers", f"GET /rooms/big/ws HTTP/1.1\r\n{UPGRADE}" + "".join(f"X-{i}: a\r\n" for i in range(130)) + "\r\n",
     b"431", "headers_too_large"),
    ("a body on the upgrade", f"GET /rooms/big/ws HTTP/1.1\r\n{UPGRADE}Content-Length: 3\r\n\r\nabc",
     b"400", "bad_request"),
])
def test_an_upgrade_websockets_refuses_is_answered_closed_and_counted(gateway: tuple[Proc, int], what: str,
                                                                       request_bytes: str, status: bytes,
                                                                       reason: str) -> None:
    """Before: websockets' 414/431 sat in its buffer, never written, and the socket stayed open
    (300 of 300 held, one fd each, for minutes)."""
    proc, port = gateway
    before = _refused_total(port, reason)
    socks = [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(OVERSIZED)]
    try:
        for sock in socks:
            sock.sendall(request_bytes.encode())
        # Far past the 1 s header deadline: these are answered at once, or never.
        answers = _answers(socks, timeout=30.0)
    finally:
        for sock in socks:
            sock.close()
    unanswered = [a[:40] for a in answers if not a.startswith(b"HTTP/1.1 " + status) or not a.endswith(b"<EOF>")]
    assert not unanswered, f"{what}: {len(unanswered)} of {OVERSIZED} not answered {status!r} and closed"
    assert _refused_total(port, reason) - before == OVERSIZED
    # The gateway holds none of them, and still serves.
    assert httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=10).status_code == 200
    assert proc.alive()


def test_a_header_deadline_close_is_counted(gateway: tuple[Proc, int]) -> None:
    _, port = gateway
    before = _refused_total(port, "headers_timeout")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /rooms/slow/ws HT")
        assert _closed_by_server([sock], timeout=60.0) == 1
    assert _refused_total(port, "headers_timeout") - before == 1
