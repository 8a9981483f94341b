"""Captioned speech: ``POST /v1/audio/speech``'s audio with word timestamps, in Kokoro-FastAPI's
``/dev/captioned_speech`` shape (the endpoints are in app/api/speech_api.py).

``stream`` true (the default, as in Kokoro-FastAPI): NDJSON, one object a line, each holding the
next piece of the encoded audio (base64; the pieces joined are the file ``/v1/audio/speech``
sends) and the words heard so far that no earlier line gave, so a word comes before or with the
piece that holds it. ``stream`` false: one object, the whole file and every word::

    {"audio": "<base64>", "audio_format": "audio/wav",
     "timestamps": [{"word": "Good", "start_time": 0.12, "end_time": 0.41, "offset": 0, "length": 4}]}

Times are seconds from the first sample of the response's audio, across every line of a long
input, divided by ``speed``. ``offset``/``length`` (a voxroom addition) place the word in the
request's ``input``, in code points. Words come from the workers' word marks
(app/api/speech_room.py): a voice whose engine gives none has ``timestamps: []``.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import AsyncIterator, Iterable
from typing import Any, Final, NamedTuple, TypedDict

from starlette.responses import JSONResponse, Response

from app.api.speech_formats import CONTENT_TYPES, Encoder
from app.api.speech_room import HeardWord, SpeechRoom
from app.api.voices_api import api_error
from voxroom.errors import ResponseCut

NDJSON_TYPE: Final = "application/json"
"""What Kokoro-FastAPI labels its NDJSON stream with; clients read it line by line either way."""
_MARKUP: Final = re.compile(r"\[[^\[\]]*\]|<[^<>]*>")
"""Pause and SSML tags (voxroom/voices/markup.py's candidates): never a spoken word, so never matched."""


class Timestamp(TypedDict, total=False):
    word: str
    start_time: float
    end_time: float
    offset: int
    length: int


class Options(NamedTuple):
    stream: bool
    timestamps: bool


def options(body: dict[str, Any]) -> Options | Response:
    """``stream`` and ``return_timestamps`` (both default true, as in Kokoro-FastAPI), or the 400."""
    got = []
    for name in ("stream", "return_timestamps"):
        value = body.get(name, True)
        if not isinstance(value, bool):
            return api_error(400, f"'{name}' must be a boolean", "bad_message", param=name)
        got.append(value)
    return Options(*got)


class Captions:
    """The words a room has heard, as timestamps of the request, handed out once each."""

    def __init__(self, reader: SpeechRoom, text: str, speed: float) -> None:
        self._reader = reader
        self._speed = speed
        self._taken = 0
        # Each word is looked up in the input after the one before (lines are in the input's
        # order), with tags blanked so that a word never matches inside one.
        self._text = _MARKUP.sub(lambda m: " " * len(m.group()), text)
        self._cursor = 0

    def take(self) -> list[Timestamp]:
        """The words heard since the last call."""
        new = self._reader.words[self._taken:]
        self._taken += len(new)
        return [self._stamp(w) for w in new]

    def _stamp(self, word: HeardWord) -> Timestamp:
        stamp: Timestamp = {"word": word.text, "start_time": round(word.start_ms / 1000 / self._speed, 3),
                            "end_time": round(word.end_ms / 1000 / self._speed, 3)}
        at = self._text.find(word.text, self._cursor)
        if at >= 0:  # else (an engine's text unlike the input's) the word still has its times
            stamp["offset"], stamp["length"] = at, len(word.text)
            self._cursor = at + len(word.text)
        return stamp


def _line(audio: bytes, fmt: str, stamps: Iterable[Timestamp]) -> bytes:
    obj = {"audio": base64.b64encode(audio).decode("ascii"), "audio_format": CONTENT_TYPES[fmt],
           "timestamps": list(stamps)}
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


async def ndjson(reader: SpeechRoom, encoder: Encoder, fmt: str, captions: Captions | None) -> AsyncIterator[bytes]:
    """The streamed body: a line per piece of encoded audio, with the words not given yet (words
    wait for audio, as in Kokoro-FastAPI; the last line takes whatever is left). ``captions``
    ``None``: ``timestamps`` is always empty. Raises :class:`~voxroom.errors.ResponseCut` when
    it cannot be whole (app/api/speech_stream.py ends the body visibly broken)."""
    held: list[Timestamp] = []
    async for slices in reader.batches():
        audio = b"".join(encoder.feed(s) for s in slices)
        held += captions.take() if captions else []
        if audio:
            yield _line(audio, fmt, held)
            held = []
    tail = encoder.finish()  # batches() raised ResponseCut unless every line ended well
    held += captions.take() if captions else []
    if tail or held:
        yield _line(tail, fmt, held)


async def whole(reader: SpeechRoom, encoder: Encoder, fmt: str, captions: Captions | None,
                headers: dict[str, str]) -> Response:
    """The unstreamed answer: every byte and word in one JSON object, or a 500 when synthesis did
    not finish (nothing was sent yet, so it can still be a status)."""
    try:
        audio = [encoder.feed(s) async for slices in reader.batches() for s in slices]
    except ResponseCut as exc:
        return api_error(500, f"synthesis failed: {exc}", "synthesis_failed")
    audio.append(encoder.finish())
    return JSONResponse({"audio": base64.b64encode(b"".join(audio)).decode("ascii"),
                         "audio_format": CONTENT_TYPES[fmt], "timestamps": captions.take() if captions else []},
                        headers=headers)
