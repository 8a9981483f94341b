"""``VOXROOM_LOG_FORMAT=json``: a real gateway writes one JSON object per line, uvicorn's lines included."""

from __future__ import annotations

import json
import logging
from pathlib import Path

from tests.support.processes import start_gateway
from voxroom.runtime.logjson import JsonFormatter
from voxroom.store.server import RedisServer


def test_formatter_keeps_level_logger_message_and_extra() -> None:
    record = logging.LogRecord("voxroom.gateway", logging.WARNING, __file__, 1, "room %s full", ("lobby",), None)
    record.room = "lobby"
    out = json.loads(JsonFormatter().format(record))
    assert (out["level"], out["logger"], out["message"], out["room"]) == ("WARNING", "voxroom.gateway",
                                                                           "room lobby full", "lobby")
    assert out["time"].endswith("Z")


def test_gateway_logs_json_lines(ops_redis: RedisServer, tmp_path: Path) -> None:
    gateway, _port = start_gateway(ops_redis.url, tmp_path, VOXROOM_LOG_FORMAT="json")
    gateway.stop()
    lines = [line for line in gateway.log_path.read_text().splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # every line parses
    loggers = {r["logger"] for r in records}
    assert "voxroom.gateway" in loggers and any(name.startswith("uvicorn") for name in loggers), loggers
    assert any(r["message"].startswith("voxroom gateway on http:") for r in records)  # the banner, as a record
