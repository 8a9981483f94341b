"""``VOXROOM_DEFAULT_VOICE`` means what it says: once it was parsed and never read."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.processes import start_gateway
from tests.support.room_client import RoomClient
from voxroom.errors import ConfigError
from voxroom.voices.catalog import Catalog


def test_the_setting_replaces_the_catalogs_default_and_an_unknown_voice_is_refused() -> None:
    assert Catalog.for_settings(None, None).default == Catalog.load().default
    chosen = Catalog.for_settings(None, "en-espeak")
    assert chosen.default == "en-espeak" and chosen.get(None).id == "en-espeak"
    assert {v.id for v in chosen} == {v.id for v in Catalog.load()}
    with pytest.raises(ConfigError, match="not in the catalog"):
        Catalog.for_settings(None, "klingon-1")


async def test_a_gateway_welcomes_with_the_configured_default(redis_url: str, tmp_path: Path) -> None:
    gateway, port = start_gateway(redis_url, tmp_path, VOXROOM_DEFAULT_VOICE="en-espeak-f")
    try:
        async with RoomClient(port, "default-voice") as client:
            assert client.got.of("welcome")[0]["voice"] == "en-espeak-f"
    finally:
        gateway.stop()
