"""Piper's first-audio knobs as settings: ``VOXROOM_PIPER_FIRST_PIECE_WORDS`` and
``VOXROOM_PIPER_SOLO_THREADS`` reach a real Piper engine the way the worker builds it
(``Settings.from_env`` -> ``launch.engine_options`` -> ``registry.create_engine``), and nonsense
stops ``voxroom worker`` at start with one clear line."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys

import pytest

from tests.support.engines import synthesize
from voxroom.errors import EngineError
from voxroom.runtime.settings import Settings
from voxroom.voices.catalog import Catalog
from workers.engines.base import Engine
from workers.engines.piper.engine import SOLO_THREADS, PiperEngine
from workers.engines.piper.pieces import FIRST_PIECE_WORDS
from workers.engines.registry import create_engine
from workers.launch import engine_options

from .test_piper_first_audio import LINE

PIPER_LOG = "voxroom.engine.piper"


def worker_engine(env: dict[str, str]) -> Engine:
    engine = create_engine("piper", **engine_options("piper", Settings.from_env(env)))
    engine.load("cpu")
    return engine


def test_the_defaults_are_the_engines_own() -> None:
    assert engine_options("piper", Settings()) == {"solo_threads": SOLO_THREADS,
                                                   "first_piece_words": FIRST_PIECE_WORDS}


def test_first_piece_words_reach_the_engine(piper: PiperEngine, catalog: Catalog) -> None:
    voice = catalog.get("en-joe")
    default = synthesize(piper, voice, LINE)  # cut after "The werewolves wake up," (4 words)
    uncut = synthesize(worker_engine({"VOXROOM_PIPER_FIRST_PIECE_WORDS": "0"}), voice, LINE)
    later = synthesize(worker_engine({"VOXROOM_PIPER_FIRST_PIECE_WORDS": "5"}), voice, LINE)
    assert len(default.chunks) == 3 and len(uncut.chunks) == 2 and len(later.chunks) == 3
    # 0: the first chunk is the whole first sentence, as long as the default's two pieces of it
    # (to the model's sampled durations and the pause at the cut).
    sentence = (default.chunks[0].size + default.chunks[1].size) / default.rate
    whole = uncut.chunks[0].size / uncut.rate
    assert 0.85 * sentence < whole < 1.15 * sentence, (whole, sentence)
    # 5: the four-word first phrase is passed over; the cut comes at the next comma, after 8 words.
    head, first = default.chunks[0].size / default.rate, later.chunks[0].size / later.rate
    assert 1.4 * head < first < 0.9 * whole, (head, first, whole)


def test_solo_threads_reach_the_engine(caplog: pytest.LogCaptureFixture, catalog: Catalog) -> None:
    with caplog.at_level(logging.INFO, logger=PIPER_LOG):
        one = worker_engine({"VOXROOM_PIPER_SOLO_THREADS": "1"})
        worker_engine({})
    loaded = [r.getMessage() for r in caplog.records if r.name == PIPER_LOG and "loaded" in r.getMessage()]
    assert len(loaded) == 2
    assert loaded[0].endswith("(1 thread(s), 1 when alone)"), loaded  # no second session built
    assert loaded[1].endswith(f"(1 thread(s), {SOLO_THREADS} when alone)"), loaded
    out = synthesize(one, catalog.get("en-joe"), "A stream running alone on one thread.")
    assert out.seconds > 1.0 and float(abs(out.audio).max()) > 0.1


@pytest.mark.parametrize(("name", "value", "why"), [
    ("VOXROOM_PIPER_SOLO_THREADS", "0", r"VOXROOM_PIPER_SOLO_THREADS=0 must be at least 1"),
    ("VOXROOM_PIPER_FIRST_PIECE_WORDS", "-1", r"VOXROOM_PIPER_FIRST_PIECE_WORDS=-1 must be at least 0"),
])
def test_nonsense_stops_the_worker_at_start(redis_url: str, name: str, value: str, why: str) -> None:
    env = {**os.environ, "REDIS_URL": redis_url, name: value, "VOXROOM_WORKER_METRICS_PORT": "0"}
    done = subprocess.run([sys.executable, "-m", "voxroom_cli", "worker", "--engine", "offline"], env=env,
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, done.stderr
    # Refused where the environment is read (voxroom/runtime/settings_rules.py), before any engine loads.
    assert done.stderr.strip().splitlines()[-1].startswith("voxroom: bad settings: "), done.stderr
    assert re.search(why, done.stderr), done.stderr


@pytest.mark.parametrize(("field", "value", "why"), [
    ("piper_solo_threads", 0, r"solo_threads \(VOXROOM_PIPER_SOLO_THREADS\) must be a whole number of at least 1, "
                              r"got 0"),
    ("piper_first_piece_words", -1, r"first_piece_words \(VOXROOM_PIPER_FIRST_PIECE_WORDS\) must be a whole "
                                    r"number of at least 0, got -1"),
])
def test_the_engine_refuses_nonsense_built_in_code(field: str, value: int, why: str) -> None:
    # Settings built in code skip the environment's rules: the engine still says what is wrong.
    with pytest.raises(EngineError, match=why):
        create_engine("piper", **engine_options("piper", Settings().with_(**{field: value})))
