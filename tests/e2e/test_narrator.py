"""The narrator's text tools over real processes: pauses heard in a room, markup refused at the
gateway, and a deployment lexicon that changes what is said without ever serving stale cache."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import Stack
from tests.e2e.test_line_lexicon import speak
from tests.engines.test_markup import longest_silence_ms
from tests.support.processes import Proc, base_env, start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.store.server import RedisServer
from voxroom.wire.protocol import ROOM_RATE, SLICE_MS

LINE = "The night falls. [pause:700] Werewolves, open your eyes."


@pytest.mark.parametrize("voice", ["en-joe", "en-espeak"])
async def test_a_line_with_a_pause_is_heard_with_the_pause(stack: Stack, room: str, voice: str) -> None:
    audio = await speak(stack.port, room, LINE, voice)
    gap = longest_silence_ms(audio, ROOM_RATE)
    assert abs(gap - 700) <= SLICE_MS, f"{gap:.0f} ms of silence between the words"


async def test_markup_that_is_not_understood_is_refused_at_the_gateway(stack: Stack, room: str) -> None:
    async with RoomClient(stack.port, room) as client:
        for seq, text in enumerate(["[laugh] Ha.", "Wait [pause] now.", "<speak>Hi</speak>",
                                    'Hold <break strength="strong"/> on.'], start=1):
            await client.send_json({"type": "say", "seq": seq, "text": text, "voice": "en-espeak"})
        await client.send_json({"type": "say", "seq": 5, "text": "Fine [1].", "voice": "en-espeak"})
        await client.wait_ends(1)
    assert [(e["seq"], e["code"]) for e in client.got.of("error")] == [(s, "bad_message") for s in range(1, 5)]
    assert [m["seq"] for m in client.got.of("accepted")] == [5]


def test_a_worker_with_a_bad_lexicon_refuses_to_start(redis_url: str, tmp_path: Path) -> None:
    lexicon = tmp_path / "names.tsv"
    lexicon.write_text("# names\nLupin\tLoo pan\nSeer\n", "utf-8")
    worker = Proc([sys.executable, "-m", "voxroom_cli", "worker", "--engine", "offline"],
                  base_env(redis_url, VOXROOM_LEXICON=str(lexicon)), tmp_path / "worker.log")
    try:
        code = worker.popen.wait(60)
        log = worker.log_text()
    finally:
        worker.stop()
    assert code == 2, log
    assert f"{lexicon}:3: expected a word or phrase, a tab, and its respelling" in log
    assert "ready:" not in log


async def test_the_lexicon_changes_the_audio_and_never_serves_the_old_cache(tmp_path: Path) -> None:
    line = "The GM calls the seer."
    lexicon = tmp_path / "names.tsv"
    lexicon.write_text("GM\tgame master of the village\n", "utf-8")
    # A Redis of its own: the shared stack's worker must not take these lines.
    with RedisServer() as redis:
        gateway, port = start_gateway(redis.url, tmp_path)
        worker = start_worker(redis.url, tmp_path, engine="offline", name="plain")
        try:
            first = await speak(port, "lex-1", line, "en-espeak")
            again = await speak(port, "lex-2", line, "en-espeak")
            worker.stop()
            worker = start_worker(redis.url, tmp_path, engine="offline", name="lexicon",
                                  VOXROOM_LEXICON=str(lexicon))
            respelled = await speak(port, "lex-3", line, "en-espeak")
            respelled_again = await speak(port, "lex-4", line, "en-espeak")
        finally:
            worker.stop()
            gateway.stop()
    # The second line came from the cache (espeak-ng never says a line twice sample for sample),
    assert np.array_equal(first, again)
    # the lexicon's worker did not take that cached audio: it said the respelling, far longer,
    assert respelled.size / ROOM_RATE - first.size / ROOM_RATE >= 0.4
    # and its own audio is cached under the new lexicon.
    assert np.array_equal(respelled, respelled_again)


async def test_the_speech_endpoint_takes_the_same_markup(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=60) as http:
        bad = await http.post("/v1/audio/speech", json={"input": "[laugh] Ha.", "voice": "en-espeak"})
        long = await http.post("/v1/audio/speech", json={"input": "x" * 249 + " [pause:100] " + "x" * 250,
                                                          "voice": "en-espeak", "response_format": "pcm"})
        resp = await http.post("/v1/audio/speech", json={"input": LINE, "voice": "en-espeak",
                                                          "response_format": "pcm"})
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "bad_message"
    assert long.status_code == 200  # 500 characters to say: the markup does not count
    assert resp.status_code == 200
    audio = np.frombuffer(resp.content, dtype="<i2").astype(np.float64) / 32768
    assert abs(longest_silence_ms(audio, ROOM_RATE) - 700) <= SLICE_MS
