"""Keep secrets out of logs: room tokens travel in the WebSocket URL's query string, and uvicorn
logs request paths with their query strings."""

from __future__ import annotations

import logging
import re

_TOKEN = re.compile(r"(token=)[^&\s\"']+")
REDACTED = r"\1[redacted]"


def redact(text: str) -> str:
    return _TOKEN.sub(REDACTED, text)


class RedactTokens(logging.Filter):
    """Rewrites ``token=...`` in a record's message and string arguments. Always lets it through."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str) and "token=" in record.msg:
            record.msg = redact(record.msg)
        if isinstance(record.args, tuple):
            record.args = tuple(redact(a) if isinstance(a, str) and "token=" in a else a for a in record.args)
        return True


def install(*logger_names: str) -> None:
    """Attach the filter to these loggers (uvicorn's by default), after their configuration."""
    for name in logger_names or ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).addFilter(RedactTokens())
