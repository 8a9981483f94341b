"""``GET /v1/voices``, ``POST /v1/voices/search`` and ``say`` with a scene, on real processes."""

from __future__ import annotations

import httpx

from tests.audio_analysis import is_speech_like
from tests.conftest import Stack
from tests.support.room_client import RoomClient
from voxroom.protocol import ROOM_RATE


async def test_voices_are_listed_and_filtered_by_any_spelling_of_a_language(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}") as http:
        everything = (await http.get("/v1/voices")).json()
        assert everything["default"] == "en-joe"
        assert {"en-joe", "yue-espeak", "yue-espeak-f"} <= {v["id"] for v in everything["voices"]}
        assert all("params" not in v for v in everything["voices"])  # no engine internals
        for spelling in ("cantonese", "zh-HK", "yue", "粤语"):
            found = (await http.get("/v1/voices", params={"language": spelling})).json()["voices"]
            assert {v["id"] for v in found} == {"yue-espeak", "yue-espeak-f"}, spelling
        women = (await http.get("/v1/voices", params={"language": "mandarin", "gender": "woman"})).json()
        assert {v["id"] for v in women["voices"]} == {"cmn-espeak-f", "cmn-espeak-grandma"}
        bad = await http.get("/v1/voices", params={"language": "klingonese"})
        assert bad.status_code == 400 and bad.json()["error"]["code"] == "unknown_language"


async def test_search_returns_the_top_k_with_scores_and_refuses_bad_scenes(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}") as http:
        resp = await http.post("/v1/voices/search", json={"scene": {"language": "zh-HK", "gender": "female"}, "k": 3})
        assert resp.status_code == 200
        results = resp.json()["results"]
        assert [r["id"] for r in results][:2] == ["yue-espeak-f", "yue-espeak"]
        assert len(results) == 3
        assert results[0]["score"] > results[1]["score"] > results[2]["score"]
        for body in ({}, {"scene": {}}, {"scene": {"emotion": 3}}, {"scene": {"age": "old"}, "k": 0}, [1]):
            bad = await http.post("/v1/voices/search", json=body)
            assert bad.status_code == 400, body
            assert bad.json()["error"]["type"] == "invalid_request_error"
        assert (await http.post("/v1/voices/search", content=b"{nope")).status_code == 400


async def test_a_say_with_a_scene_speaks_with_the_best_voice_for_it(stack: Stack, room: str) -> None:
    async with RoomClient(stack.port, room) as client:
        await client.send_json({"type": "say", "seq": 1, "text": "天黑请闭眼，狼人请睁眼。",
                                "scene": {"language": "cantonese", "gender": "female"}})
        await client.send_json({"type": "say", "seq": 2, "text": "x", "scene": {"bad key": "x"}})
        await client.wait_ends(1)
    assert client.got.of("accepted")[0]["seq"] == 1
    assert client.got.of("start")[0]["voice"] == "yue-espeak-f"
    assert [e["code"] for e in client.got.of("error")] == ["bad_message"]
    audio = client.got.audio(1).astype(float) / 32768
    verdict = is_speech_like(audio, ROOM_RATE)
    assert verdict, verdict.reason
