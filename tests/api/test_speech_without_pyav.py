"""A gateway without PyAV (the image's old dependency set): what needs it is a 400 in OpenAI's
shape, never a 500. PyAV stays installed: the one lookup (``speech_formats.PYAV_MODULE``) is
pointed at a module that does not exist. And any unexpected failure of a ``/v1`` handler is a
JSON 500 in OpenAI's shape (the app in memory)."""

from __future__ import annotations

import json

import pytest

from app.api import speech_api, speech_formats


@pytest.fixture
def no_pyav(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(speech_formats, "PYAV_MODULE", "voxroom_test_no_such_module")


def refused(body: dict[str, object]) -> tuple[int, dict[str, object]]:
    answer = speech_api._options(body)
    assert not isinstance(answer, tuple), f"accepted: {answer}"
    return answer.status_code, json.loads(bytes(answer.body))["error"]


def test_speed_without_pyav_is_a_400_naming_the_missing_library(no_pyav: None) -> None:
    status, error = refused({"input": "Hello.", "response_format": "wav", "speed": 1.5})
    assert status == 400
    assert error["code"] == "unsupported_speed" and error["param"] == "speed"
    assert error["type"] == "invalid_request_error" and "PyAV" in str(error["message"])


def test_encoded_formats_without_pyav_are_a_400_and_wav_pcm_still_work(no_pyav: None) -> None:
    assert speech_formats.available_formats() == ["wav", "pcm"]
    for fmt in ("mp3", "opus", "aac", "flac"):
        status, error = refused({"input": "Hello.", "response_format": fmt})
        assert status == 400 and error["code"] == "unsupported_format", fmt
        assert "PyAV" in str(error["message"]) and error["param"] == "response_format"
    accepted = speech_api._options({"input": "Hello.", "speed": 1.0})
    assert accepted == (["Hello."], "wav", 1.0)  # the default falls back from mp3 to wav
    encoder = speech_formats.make_encoder("pcm", 1.0)
    assert encoder.finish() == b""


def test_what_refusal_lets_through_make_encoder_builds() -> None:
    for fmt in speech_formats.available_formats():
        for speed in (0.25, 1.0, 1.5, 4.0):
            assert speech_formats.refusal(fmt, speed) is None
            speech_formats.make_encoder(fmt, speed).finish()


def test_an_unexpected_failure_in_a_v1_handler_is_a_json_500_not_plain_text() -> None:
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route
    from starlette.testclient import TestClient

    from app.api.voices_api import json_errors

    async def broken(request: Request) -> Response:
        raise RuntimeError("a bug")

    app = Starlette(routes=[Route("/v1/broken", json_errors(broken))])
    with TestClient(app, raise_server_exceptions=True) as http:
        resp = http.get("/v1/broken")
    assert resp.status_code == 500
    assert resp.json() == {"error": {"message": "internal error; the server logged it", "type": "server_error",
                                     "param": None, "code": "internal_error"}}
