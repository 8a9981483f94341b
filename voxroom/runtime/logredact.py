"""Keep secrets out of logs: room tokens travel in the WebSocket URL's query string, and uvicorn
logs request paths with their query strings.

A parameter name is compared after percent-decoding, as the gateway reads it: ``?to%6Ben=...`` is
the ``token`` parameter to Starlette, so it is redacted too (it once was not).
"""

from __future__ import annotations

import logging
import re
from urllib.parse import unquote_plus

# name=value, the name in the characters a query string's names are written with (% escapes too).
_PARAM = re.compile(r"([A-Za-z0-9%._~+-]*)=([^&\s\"']+)")
REDACTED = "[redacted]"


def _secret_name(name: str) -> bool:
    # Decoded until it stops changing (a few rounds at most): whatever layer decodes it, a name
    # that reads as "token" is treated as one.
    for _ in range(4):
        decoded = unquote_plus(name)
        if decoded == name:
            break
        name = decoded
    return "token" in name.lower()


def _replace(match: re.Match[str]) -> str:
    name = match.group(1)
    return f"{name}={REDACTED}" if _secret_name(name) else match.group(0)


def _may_hold_token(text: str) -> bool:
    return "=" in text and ("%" in text or "token" in text.lower())


def redact(text: str) -> str:
    return _PARAM.sub(_replace, text) if _may_hold_token(text) else text


class RedactTokens(logging.Filter):
    """Rewrites ``token=...`` (however its name is percent-encoded) in a record's message and string
    arguments. Always lets it through."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) else a for a in record.args)
        return True


def install(*logger_names: str) -> None:
    """Attach the filter to these loggers (uvicorn's by default), after their configuration."""
    for name in logger_names or ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).addFilter(RedactTokens())
