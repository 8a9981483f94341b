"""The speaker cache is bounded (workers/engines/chattts/speakers.py): a client can name any mix of
voices (``a:2+b``), so one context sees unboundedly many voice ids. The tiny checkpoint's own
ChatTTS speaker statistics make the embeddings; mixes are resolved by a real catalog."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from voxroom.errors import EngineError
from voxroom.runtime.settings import Settings
from voxroom.voices.catalog import Catalog, Voice
from workers.engines.chattts import ChatTTSEngine
from workers.engines.chattts.speakers import SPEAKER_CACHE, SpeakerBank
from workers.engines.registry import create_engine
from workers.launch import engine_options

CATALOG = Catalog([Voice(id=name, engine="chattts", language="eng", params={"seed": seed})
                   for name, seed in (("a", 11), ("b", 22), ("c", 33))], "a")
MIXES = [f"a:{w}+b" for w in range(2, 42)] + [f"b:{w}+c:3" for w in range(4, 44)]
"""80 distinct canonical mix ids."""


def bank(engine: ChatTTSEngine, capacity: int = 8) -> SpeakerBank:
    return SpeakerBank(engine.chat.speaker, engine.device, CATALOG.get, capacity=capacity)


def test_many_mixes_keep_the_bank_at_its_bound(engine: ChatTTSEngine) -> None:
    small = bank(engine)
    first = {}
    for mix in MIXES:
        first[mix] = small.embedding(CATALOG.get(mix))
        assert len(small) <= 8
    assert len(small) == 8
    # Every mix is a voice of its own (not one embedding for all) ...
    assert not torch.equal(first[MIXES[0]], first[MIXES[-1]])
    # ... and one evicted long ago comes back bit for bit, as an unbounded bank makes it.
    again = small.embedding(CATALOG.get(MIXES[0]))
    assert torch.equal(again, first[MIXES[0]])
    roomy = bank(engine, capacity=1000)
    for mix in MIXES:
        assert torch.equal(roomy.embedding(CATALOG.get(mix)), first[mix]), mix
    assert len(roomy) == len(MIXES) + 3  # the mixes and their three parts
    assert len(small) == 8


def test_the_least_recently_used_voice_goes_first(engine: ChatTTSEngine) -> None:
    small = bank(engine, capacity=4)
    kept = small.embedding(CATALOG.get("c"))
    for mix in MIXES[:20]:  # mixes of a and b only: c is not touched as a part
        small.embedding(CATALOG.get(mix))
        assert small.embedding(CATALOG.get("c")) is kept  # used every time: never evicted
    lost = small.embedding(CATALOG.get(MIXES[0]))
    for mix in MIXES[1:5]:
        small.embedding(CATALOG.get(mix))
    # Evicted by four newer ids: computed again, equal to the first one.
    back = small.embedding(CATALOG.get(MIXES[0]))
    assert back is not lost and torch.equal(back, lost)


def test_a_bank_without_room_is_refused(engine: ChatTTSEngine) -> None:
    assert SPEAKER_CACHE >= 1
    with pytest.raises(EngineError, match="speaker cache holds at least 1"):
        bank(engine, capacity=0)



def test_the_setting_bounds_each_contexts_bank(tiny_dir: Path) -> None:
    settings = Settings.from_env({"VOXROOM_CHATTTS_SPEAKER_CACHE": "4", "VOXROOM_CHATTTS_SOURCE": "custom",
                                  "VOXROOM_CHATTTS_DIR": str(tiny_dir)})
    engine = create_engine("chattts", **engine_options("chattts", settings, CATALOG))
    engine.load("cpu")
    try:
        for mix in MIXES[:10]:
            first = engine.embedding(CATALOG.get(mix))
        assert len(engine._bank) == 4
        assert torch.equal(engine.embedding(CATALOG.get(MIXES[9])), first)
    finally:
        engine.close()
    with pytest.raises(EngineError, match="VOXROOM_CHATTTS_SPEAKER_CACHE"):
        create_engine("chattts", **engine_options("chattts", settings.with_(chattts_speaker_cache=0), CATALOG))
