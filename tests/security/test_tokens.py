"""Token rules that need no server: subjects, expiry, the redaction of tokens from logs."""

from __future__ import annotations

import logging

import pytest

from voxroom.runtime import logredact
from voxroom.wire import tokens

SECRET = "s" * 32


def test_a_subject_in_the_self_chosen_namespace_is_refused_both_ways() -> None:
    with pytest.raises(ValueError, match="may not start"):
        tokens.mint(SECRET, "r", "speaker", subject="c-alice")
    import jwt

    forged = jwt.encode({"room": "r", "role": "speaker", "exp": 2**40, "sub": "c-alice"}, SECRET, algorithm="HS256")
    with pytest.raises(tokens.TokenError, match="may not start"):
        tokens.verify(SECRET, forged, "r")


def test_grants() -> None:
    grant = tokens.verify(SECRET, tokens.mint(SECRET, "*", "listener", subject="bob"), "any-room")
    assert (grant.room, grant.role, grant.subject, grant.can_speak) == ("any-room", "listener", "bob", False)
    with pytest.raises(tokens.TokenError, match="expired"):
        tokens.verify(SECRET, tokens.mint(SECRET, "r", "speaker", ttl_s=-10), "r")


def test_the_log_filter_redacts_tokens_in_messages_and_arguments() -> None:
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, '%s - "WebSocket %s" [accepted]',
                               ("127.0.0.1:5", "/rooms/r/ws?client=a&token=eyJabc.def.ghi&codec=opus"), None)
    assert logredact.RedactTokens().filter(record)
    assert record.getMessage() == ('127.0.0.1:5 - "WebSocket /rooms/r/ws?client=a&token=[redacted]&codec=opus" '
                                   '[accepted]')


@pytest.mark.parametrize("query", [
    "to%6Ben=eyJabc.def.ghi", "%74%6F%6B%65%6E=eyJabc.def.ghi", "TOKEN=eyJabc.def.ghi", "to%256Ben=eyJabc.def.ghi",
])
def test_a_token_parameter_is_redacted_however_its_name_is_percent_encoded(query: str) -> None:
    # Starlette percent-decodes parameter names: ?to%6Ben=... is the token parameter to the gateway.
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, '%s - "WebSocket %s" [accepted]',
                               ("127.0.0.1:5", f"/rooms/r/ws?client=a&{query}&codec=opus"), None)
    assert logredact.RedactTokens().filter(record)
    message = record.getMessage()
    assert "eyJabc" not in message and "[redacted]&codec=opus" in message and "client=a&" in message


def test_a_subject_in_the_generated_namespace_is_refused_both_ways() -> None:
    with pytest.raises(ValueError, match="may not start"):
        tokens.mint(SECRET, "r", "speaker", subject="g-0123456789abcdef")
    import jwt

    forged = jwt.encode({"room": "r", "role": "speaker", "exp": 2**40, "sub": "g-1"}, SECRET, algorithm="HS256")
    with pytest.raises(tokens.TokenError, match="may not start"):
        tokens.verify(SECRET, forged, "r")


@pytest.mark.parametrize(("room", "kw", "says"), [
    ("a:b", {}, "not a room id"),
    ("", {}, "not a room id"),
    ("r", {"subject": "bob smith"}, "not a client id"),
    ("r", {"subject": ""}, "not a client id"),
    ("r", {"secret": "x" * 31}, "at least 32 bytes"),
])
def test_mint_refuses_what_the_gateway_refuses(room: str, kw: dict[str, str], says: str) -> None:
    secret = kw.pop("secret", SECRET)
    with pytest.raises(ValueError, match=says):
        tokens.mint(secret, room, "speaker", **kw)  # type: ignore[arg-type]
    # Every room id the gateway takes, and the wildcard, still mint.
    for ok in ("*", "r", "A-z_0" * 12 + "abcd"):
        assert tokens.verify(SECRET, tokens.mint(SECRET, ok, "speaker", subject="bob_1"), "r" if ok == "*" else ok)
