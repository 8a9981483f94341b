"""The auth matrix over a real gateway with auth on (signed room tokens, an Origin allow-list),
a real worker and a real redis-server: who may join which room, who may speak, and what a refused
client is told.
"""

from __future__ import annotations

import asyncio
import base64
import json
import subprocess
import sys
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import jwt
import pytest

from tests.conftest import Stack
from tests.support.processes import ROOT, Proc, base_env, start_gateway
from tests.support.ws_clients import QueryClient, connect, next_json, refusal, ws_url
from voxroom.store.server import free_port
from voxroom.wire import tokens
from voxroom.wire.protocol import CloseCode, ErrorCode

SECRET = "test-secret-for-room-tokens-0123456789"  # 38 bytes: over the 32-byte floor
GOOD_ORIGIN = "http://good.example"


@pytest.fixture(scope="module")
def auth_gateway(stack: Stack, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Proc, int]]:
    """A gateway with auth on and an Origin allow-list, on the session's Redis (so the session's
    worker speaks for it)."""
    gateway, port = start_gateway(stack.redis_url, tmp_path_factory.mktemp("auth-gateway"), insecure=False,
                                  VOXROOM_JWT_SECRET=SECRET, VOXROOM_ALLOWED_ORIGINS=GOOD_ORIGIN)
    try:
        yield gateway, port
    finally:
        gateway.stop()


@pytest.fixture
def auth_port(auth_gateway: tuple[Proc, int]) -> int:
    return auth_gateway[1]


def speaker(room: str, **kw: object) -> str:
    return tokens.mint(SECRET, room, "speaker", **kw)  # type: ignore[arg-type]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _unb64(part: str) -> bytes:
    return base64.urlsafe_b64decode(part + "=" * (-len(part) % 4))


def payload_swapped(room: str) -> str:
    """A listener token whose payload was edited to say speaker, the signature left as it was."""
    header, payload, signature = tokens.mint(SECRET, room, "listener").split(".")
    claims = json.loads(_unb64(payload))
    claims["role"] = "speaker"
    return ".".join([header, _b64(json.dumps(claims).encode()), signature])


def signature_flipped(room: str) -> str:
    header, payload, signature = speaker(room).split(".")
    raw = bytearray(_unb64(signature))
    raw[0] ^= 0x01  # one bit of the MAC (the first byte: base64 padding bits cannot hide it)
    return ".".join([header, payload, _b64(bytes(raw))])


def unsigned(room: str) -> str:
    """``alg: none``: the classic JWT bypass."""
    claims = {"room": room, "role": "speaker", "exp": int(time.time()) + 600}
    return ".".join([_b64(b'{"alg":"none","typ":"JWT"}'), _b64(json.dumps(claims).encode()), ""])


def signed_claims(claims: dict[str, object], *, algorithm: str = "HS256", secret: str = SECRET) -> str:
    with warnings.catch_warnings():
        # PyJWT warns that 38 bytes is short for HS512; the test means to reuse the secret as is.
        warnings.simplefilter("ignore", jwt.warnings.InsecureKeyLengthWarning)
        return jwt.encode(claims, secret, algorithm=algorithm)


LATER = int(time.time()) + 3600

REFUSALS: list[tuple[str, Callable[[str], str | None], str]] = [
    ("no token", lambda room: None, "token required"),
    ("empty token", lambda room: "", "token required"),
    ("expired", lambda room: speaker(room, ttl_s=60, now=time.time() - 3600), "token expired"),
    ("payload edited", payload_swapped, "bad token signature"),
    ("signature edited", signature_flipped, "bad token signature"),
    ("wrong secret", lambda room: tokens.mint("another-secret-of-at-least-32-bytes!!", room, "speaker"),
     "bad token signature"),
    ("another room", lambda room: speaker(f"{room}-other"), "token is for another room"),
    ("alg none", unsigned, "malformed token"),
    ("HS512, same secret", lambda room: signed_claims({"room": room, "role": "speaker", "exp": LATER},
                                                      algorithm="HS512"), "malformed token"),
    ("garbage", lambda room: "not.a.token", "malformed token"),
    ("no exp", lambda room: signed_claims({"room": room, "role": "speaker"}), "token lacks the 'exp' claim"),
    ("no role", lambda room: signed_claims({"room": room, "exp": LATER}), "token lacks the 'role' claim"),
    ("role admin", lambda room: signed_claims({"room": room, "role": "admin", "exp": LATER}),
     "token role must be speaker, listener or host"),
]


@pytest.mark.parametrize(("case", "make", "reason"), REFUSALS, ids=[c for c, _, _ in REFUSALS])
async def test_bad_tokens_are_refused_with_1008_and_a_clear_reason(auth_port: int, room: str, case: str,
                                                                   make: Callable[[str], str | None],
                                                                   reason: str) -> None:
    token = make(room)
    url = ws_url(auth_port, room) if token is None else ws_url(auth_port, room, token=token)
    assert await refusal(url) == (CloseCode.POLICY_VIOLATION, reason), case


async def test_a_star_token_joins_any_room(auth_port: int, room: str) -> None:
    token = speaker("*")
    for target in (room, f"{room}-2"):
        ws = await connect(ws_url(auth_port, target, token=token))
        try:
            welcome = await next_json(ws, kind="welcome")
            assert welcome["room"] == target and welcome["role"] == "speaker"
        finally:
            await ws.close()


async def test_a_listener_hears_the_room_but_cannot_speak(auth_port: int, room: str) -> None:
    async with QueryClient(auth_port, room, token=speaker(room)) as talker, \
            QueryClient(auth_port, room, token=tokens.mint(SECRET, room, "listener")) as listener:
        assert listener.got.of("welcome")[0]["role"] == "listener"
        assert talker.got.of("welcome")[0]["role"] == "speaker"
        await listener.say("Let me speak!", seq=1)
        await listener.wait_for(lambda g: bool(g.of("error")), 10)
        assert listener.errors() == [{"type": "error", "code": ErrorCode.FORBIDDEN,
                                      "message": "a listener token cannot speak", "seq": 1}]
        await talker.say("Only speakers speak.", seq=1)
        await listener.wait_ends(1)
        # The listener hears the speaker's line, and its own refused line was never queued.
        assert [s["text"] for s in listener.got.of("start")] == ["Only speakers speak."]
        assert listener.got.frames_of(listener.got.ends()[0]["utterance"])
        assert listener.closed is None


async def test_the_token_subject_is_the_client_id_and_dedupe_survives_a_reconnect(auth_port: int,
                                                                                 room: str) -> None:
    token = speaker(room, subject="player-7")
    # The subject wins over a self-chosen ?client=: a signed identity cannot be overridden.
    async with QueryClient(auth_port, room, token=token, client="someone-else") as first:
        assert first.got.of("welcome")[0]["client"] == "player-7"
        await first.say("First line.", seq=1)
        await first.wait_for(lambda g: bool(g.of("accepted")), 10)
    async with QueryClient(auth_port, room, token=token) as again:
        assert again.got.of("welcome")[0]["client"] == "player-7"
        await again.say("First line.", seq=1)  # a resend after the reconnect
        await again.wait_for(lambda g: bool(g.of("error")), 10)
        assert again.errors()[0]["code"] == ErrorCode.DUPLICATE
        await again.say("Second line.", seq=2)
        await again.wait_for(lambda g: bool(g.of("accepted")), 10)
        assert again.got.of("accepted")[0]["seq"] == 2
        await again.wait_for(lambda g: any(s["text"] == "Second line." for s in g.of("start")), 30)
        assert {s["sender"] for s in again.got.of("start")} == {"player-7"}


async def test_a_token_without_subject_cannot_take_another_clients_identity(auth_port: int, room: str) -> None:
    # With auth on, a self-chosen ?client= id lives in the c- namespace that token subjects may not use.
    ws = await connect(ws_url(auth_port, room, token=speaker(room), client="player-7"))
    try:
        welcome = await next_json(ws, kind="welcome")
    finally:
        await ws.close()
    assert welcome["client"] == "c-player-7"


def _cli(*args: str, secret: str | None = None) -> subprocess.CompletedProcess[str]:
    env = base_env("redis://127.0.0.1:1/0")
    env.pop("REDIS_URL")
    if secret is not None:
        env["VOXROOM_JWT_SECRET"] = secret
    return subprocess.run([sys.executable, "-m", "voxroom_cli", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=60)


async def test_voxroom_token_mints_a_token_the_gateway_accepts(auth_port: int, room: str) -> None:
    out = _cli("token", "--room", room, "--role", "listener", "--secret", SECRET)
    assert out.returncode == 0, out.stderr
    ws = await connect(ws_url(auth_port, room, token=out.stdout.strip()))
    try:
        welcome = await next_json(ws, kind="welcome")
        assert welcome["role"] == "listener"
    finally:
        await ws.close()
    # The secret can come from the environment too, and the subject becomes the client id.
    out = _cli("token", "--room", room, "--subject", "cli-user", secret=SECRET)
    assert out.returncode == 0, out.stderr
    assert tokens.verify(SECRET, out.stdout.strip(), room) == tokens.Grant(room, "speaker", "cli-user")
    # Without any secret it says what is missing.
    out = _cli("token", "--room", room)
    assert out.returncode == 2 and "VOXROOM_JWT_SECRET" in out.stderr and "Traceback" not in out.stderr


@pytest.mark.parametrize(("args", "says"), [
    (("--room", "a:b"), "not a room id: 'a:b'"),
    (("--room", "x" * 65), "not a room id"),
    (("--room", "ok", "--subject", "bad id"), "not a client id: 'bad id'"),
    (("--room", "ok", "--subject", "s" * 65), "not a client id"),
    (("--room", "ok", "--ttl", "0"), "--ttl must be at least 1 second, not 0"),
    (("--room", "ok", "--ttl", "-5"), "--ttl must be at least 1 second, not -5"),
    (("--room", "ok", "--secret", "x" * 31), "the secret must be at least 32 bytes"),
])
def test_voxroom_token_refuses_a_token_no_gateway_would_take(args: tuple[str, ...], says: str) -> None:
    # Each of these once printed a token: for a room or client id the gateway closes with 1008,
    # already expired, or signed with a key no gateway may start with (PyJWT only warned).
    out = _cli("token", *args, secret=SECRET)
    assert (out.returncode, out.stdout) == (2, ""), (out.returncode, out.stdout, out.stderr)
    (line,) = out.stderr.splitlines()
    assert line.startswith("voxroom token: ") and says in line, line


@pytest.mark.parametrize(("secret", "message"), [
    (None, "set VOXROOM_JWT_SECRET (room tokens) or pass --insecure-dev"),
    ("x" * 31, "VOXROOM_JWT_SECRET must be at least 32 bytes"),
])
def test_a_gateway_without_a_usable_secret_refuses_to_start(stack: Stack, tmp_path: Path, secret: str | None,
                                                            message: str) -> None:
    env = base_env(stack.redis_url) | ({"VOXROOM_JWT_SECRET": secret} if secret is not None else {})
    proc = Proc([sys.executable, "-m", "voxroom_cli", "gateway", "--port", str(free_port())], env,
                tmp_path / "gateway.log")
    try:
        code = proc.popen.wait(30)
    finally:
        proc.stop()
    log = proc.log_path.read_text(errors="replace")
    assert code != 0
    assert message in log
    assert "Traceback" not in log


async def test_origins_outside_the_allow_list_are_refused(auth_port: int, room: str) -> None:
    token = speaker(room)
    for origin in ("http://evil.example", "null", "http://good.example.evil.example", "https://good.example"):
        assert await refusal(ws_url(auth_port, room, token=token), origin=origin) == (
            CloseCode.POLICY_VIOLATION, "origin not allowed"), origin
    # The allowed origin and clients that send none (servers, not browsers) get in.
    for allowed in (GOOD_ORIGIN, None):
        ws = await connect(ws_url(auth_port, room, token=token), origin=allowed)
        try:
            assert (await next_json(ws, kind="welcome"))["role"] == "speaker"
        finally:
            await ws.close()
    # An allowed origin is no substitute for a token.
    assert await refusal(ws_url(auth_port, room), origin=GOOD_ORIGIN) == (CloseCode.POLICY_VIOLATION,
                                                                          "token required")


async def test_tokens_do_not_reach_the_gateway_log(auth_gateway: tuple[Proc, int], room: str) -> None:
    gateway, port = auth_gateway
    token = speaker(room)
    ws = await connect(ws_url(port, room, token=token))
    try:
        await next_json(ws, kind="welcome")
    finally:
        await ws.close()
    time.sleep(0.2)  # the gateway writes its log line as it accepts
    # A bearer credential in a log can be replayed by whoever reads the log, until it expires.
    log = gateway.log_text()
    assert token.split(".")[2] not in log
    assert "token=[redacted]" in log, "the accept line is still logged, without the credential"


async def test_a_token_under_a_percent_encoded_name_is_accepted_and_kept_out_of_the_log(
        auth_gateway: tuple[Proc, int], room: str) -> None:
    gateway, port = auth_gateway
    token = speaker(room)
    # "to%6Ben" is "token" once decoded, as Starlette decodes it: the gateway takes it as the token.
    ws = await connect(f"ws://127.0.0.1:{port}/rooms/{room}/ws?to%6Ben={token}")
    try:
        assert (await next_json(ws, kind="welcome"))["role"] == "speaker"
    finally:
        await ws.close()
    deadline = time.monotonic() + 10
    while f"/rooms/{room}/ws?to%6Ben=[redacted]" not in gateway.log_text():
        assert time.monotonic() < deadline, gateway.log_text()[-2000:]
        await asyncio.sleep(0.1)
    assert token not in gateway.log_text() and token.split(".")[2] not in gateway.log_text()
