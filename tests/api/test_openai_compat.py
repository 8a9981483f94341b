"""What OpenAI clients expect around the speech endpoint, over a real gateway and worker:
``/v1/models``, ``/v1/audio/voices``, every OpenAI voice name, mixing refused clearly, and
OpenAI's JSON error shape for every ``/v1`` error."""

from __future__ import annotations

import httpx
import pytest

from app.api.openai_compat import MODELS, OPENAI_VOICES
from tests.conftest import Stack

CURRENT_OPENAI_VOICES = ("alloy", "ash", "ballad", "coral", "echo", "fable", "nova", "onyx", "sage", "shimmer",
                         "verse", "marin", "cedar")


def assert_openai_error(resp: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert resp.status_code == status, resp.text[:300]
    assert resp.headers["content-type"] == "application/json"
    error = resp.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["code"] == code and error["message"]
    assert error["type"] == ("server_error" if status >= 500 else "invalid_request_error")
    return dict(error)


async def test_models_list_names_what_the_speech_endpoint_takes(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=30) as http:
        listed = (await http.get("/v1/models")).json()
        assert listed["object"] == "list"
        assert [m["id"] for m in listed["data"]] == list(MODELS)
        assert all(m["object"] == "model" for m in listed["data"])
        assert (await http.get("/v1/models/tts-1")).json()["id"] == "tts-1"
        assert_openai_error(await http.get("/v1/models/whisper-1"), 404, "model_not_found")
        for model in MODELS:
            resp = await http.post("/v1/audio/speech", json={"model": model, "input": "Hi.", "response_format": "pcm"})
            assert resp.status_code == 200 and len(resp.content) > 1000, model


async def test_every_current_openai_voice_name_speaks_through_a_catalog_voice(stack: Stack) -> None:
    assert set(OPENAI_VOICES) == set(CURRENT_OPENAI_VOICES)
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=60) as http:
        listed = (await http.get("/v1/audio/voices")).json()
        catalog = {v["id"] for v in (await http.get("/v1/voices")).json()["voices"]}
        assert set(listed["mapped"]) == set(CURRENT_OPENAI_VOICES)
        assert set(listed["mapped"].values()) <= catalog
        assert set(listed["voices"]) == set(CURRENT_OPENAI_VOICES) | catalog
        for name in CURRENT_OPENAI_VOICES:
            resp = await http.post("/v1/audio/speech", json={"input": "Hello.", "voice": name,
                                                              "response_format": "pcm"})
            assert resp.status_code == 200, (name, resp.text[:200])
            assert resp.headers["x-voxroom-voice"] == listed["mapped"][name], name
            assert len(resp.content) > 1000, name


@pytest.mark.parametrize(("voice", "code"), [
    ("en-espeak+en-espeak-f", "voice_mix_unsupported"),
    ("en-espeak(2)+nova(1)", "voice_mix_unsupported"),
    ("en-espeak+no-such-voice", "unknown_voice"),
    ("en-espeak(x)+nova", "bad_message"),
])
async def test_voice_mixing_is_a_clear_400(stack: Stack, voice: str, code: str) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=30) as http:
        resp = await http.post("/v1/audio/speech", json={"input": "Hello.", "voice": voice})
    assert assert_openai_error(resp, 400, code)["param"] == "voice"


async def test_every_v1_error_has_openai_shape(stack: Stack) -> None:
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{stack.port}", timeout=30) as http:
        assert_openai_error(await http.get("/v1/nothing/here"), 404, "not_found")
        assert_openai_error(await http.post("/v1/chat/completions", json={}), 404, "not_found")
        wrong = await http.get("/v1/audio/speech")
        assert_openai_error(wrong, 405, "method_not_allowed")
        assert wrong.headers["allow"] == "POST"
        assert_openai_error(await http.delete("/v1/models"), 405, "method_not_allowed")
        assert_openai_error(await http.post("/v1/audio/speech", content=b"{nope"), 400, "bad_json")
        assert_openai_error(await http.post("/v1/audio/speech", json={"input": "x" * 4097}), 400, "text_too_long")
        assert (await http.get("/healthz")).status_code == 200  # outside /v1 untouched
