"""``POST /v1/audio/speech``: OpenAI's text-to-speech endpoint, on the same workers and cache.

The request becomes one utterance in a private room (``_api-<uuid>``): it goes through the same
``say`` script (so the same back-pressure), the same job stream, the same workers, the same audio
cache. The gateway reads that room's output stream itself and streams the audio as it comes,
encoded to ``response_format``, with chunked transfer. Workers publish private rooms unpaced
(nobody plays them in real time), so the response ends as soon as synthesis does.

When it ends the room's keys are deleted; when the caller goes away first, they are set to expire
instead (the worker may still be publishing into them) and the room is dropped from ``vx:rooms``.

Auth (unless ``--insecure-dev``): ``Authorization: Bearer <token>``, where OpenAI clients put
their API key, holding a room token (voxroom/tokens.py) with role ``speaker`` for the room
``_api`` or ``*``: mint one with ``voxroom token``. Missing or bad: 401; a listener: 403.

Load shedding: at most ``speech_max_streams`` responses at once per gateway; past it, 503 with
``Retry-After``. Errors have OpenAI's shape (``{"error": {"message", "type", "code"}}``).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import anyio
import numpy as np
from redis.asyncio import Redis
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from app.speech_formats import CONTENT_TYPES, Encoder, available_formats, make_encoder
from app.state import GatewayState
from app.voices_api import api_error, read_json, served
from voxroom import keys, tokens
from voxroom.errors import UnknownVoice
from voxroom.protocol import AudioFrame, ProtocolError, check_say_text, parse_scene
from voxroom.settings import Settings
from voxroom.stream_watcher import StreamWatcher
from voxroom.voice_search import resolve_scene
from voxroom.voices import Voice

log = logging.getLogger("voxroom.gateway.speech")

IDLE_TIMEOUT_S = 30.0
"""No output from the room for this long: the utterance is given up (the worker died)."""
ABANDONED_TTL_S = 300
SENDER = "api"
API_ROOM = "_api"
"""What a token's ``room`` claim names to allow this endpoint (``*`` allows it too)."""

# OpenAI's voice names, answered by the nearest catalog voice for a matching scene.
OPENAI_VOICES = {
    "alloy": {"gender": "neutral"}, "ash": {"gender": "male"}, "ballad": {"gender": "male", "style": "storyteller"},
    "coral": {"gender": "female", "emotion": "happy"}, "echo": {"gender": "male"},
    "fable": {"style": "storyteller"}, "onyx": {"gender": "male", "age": "elderly"},
    "nova": {"gender": "female", "age": "young"}, "sage": {"gender": "female", "emotion": "calm"},
    "shimmer": {"gender": "female"}, "verse": {"gender": "male", "style": "narrator"},
}


@dataclass
class _Limiter:
    limit: int
    active: int = 0


@dataclass
class _Room:
    """The private room's output stream as read so far."""

    redis: Redis
    room: str
    watcher: StreamWatcher
    """The gateway's one blocked read: a response waits there, never on a connection of its own."""
    cursor: str = "0-0"
    chunks: int = 0
    finished: bool = False
    """The ``end`` entry was read and all audio handed out."""
    status: str | None = None
    error: str = ""
    buffered: list[np.ndarray[Any, Any]] = field(default_factory=list)

    @property
    def key(self) -> str:
        return keys.room_output(self.room)

    async def read(self) -> list[np.ndarray[Any, Any]]:
        """The next slices (empty once the ``end`` entry was seen). Raises ``TimeoutError``."""
        if self.buffered:
            out, self.buffered = self.buffered, []
            return out
        deadline = time.monotonic() + IDLE_TIMEOUT_S
        while self.status is None:
            # What is there already, without blocking; then wait for more on the shared watcher.
            entries: Any = await self.redis.xrange(self.key, min="(" + self.cursor, count=256)
            if not entries:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no audio from room {self.room} in {IDLE_TIMEOUT_S:.0f} s")
                await self.watcher.wait(self.room, self.cursor, min(1.0, left))
                continue
            slices = []
            for entry_id, fields in entries:
                self.cursor = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                kind = fields.get(b"kind")
                if kind == b"chunk":
                    frame = AudioFrame.decode(fields[b"frame"])
                    slices.append(np.frombuffer(frame.payload, dtype="<i2").astype(np.int16))
                    self.chunks += 1
                elif kind == b"end":
                    self.status = fields.get(b"status", b"ok").decode()
                    self.error = fields.get(b"error", b"").decode()
            if slices:
                return slices
            if time.monotonic() > deadline:
                raise TimeoutError(f"no audio from room {self.room} in {IDLE_TIMEOUT_S:.0f} s")
        return []


def _voice(state: GatewayState, body: dict[str, Any]) -> Voice:
    """The catalog voice the request names: a catalog id, an OpenAI voice name, or a ``scene``
    (a voxroom extension). Raises :class:`UnknownVoice` or :class:`ProtocolError`."""
    scene = parse_scene(body.get("scene"))
    voice = body.get("voice")
    def is_served(v: Voice) -> bool:
        return served(state, v)

    if scene is not None:
        return resolve_scene(state.catalog, scene, is_served)
    if voice is None:
        return state.catalog.get(None)
    if not isinstance(voice, str):
        raise UnknownVoice(str(voice)[:64])
    if voice in state.catalog:
        found = state.catalog.get(voice)
        if not is_served(found):
            raise UnknownVoice(voice)
        return found
    if voice.lower() in OPENAI_VOICES:
        return resolve_scene(state.catalog, {"language": "eng", **OPENAI_VOICES[voice.lower()]}, is_served)
    raise UnknownVoice(voice)


def _options(body: dict[str, Any]) -> tuple[str, str, float] | Response:
    """``(text, response_format, speed)`` or the 400 to answer."""
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        return api_error(400, "'input' must be a non-empty string", "empty_text")
    text = text.strip()
    try:  # the same markup and length rules as a room's say (voxroom/markup.py)
        check_say_text(text)
    except ProtocolError as exc:
        return api_error(400, exc.message.replace("'text'", "'input'"), exc.code)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return api_error(400, "'model' must be a string", "bad_message")
    formats = available_formats()
    fmt = body.get("response_format", "mp3" if "mp3" in formats else "wav")
    if fmt not in formats:
        return api_error(400, f"'response_format' must be one of {', '.join(formats)}", "unsupported_format")
    if body.get("stream_format", "audio") != "audio":
        return api_error(400, "only stream_format 'audio' is supported", "unsupported_format")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not 0.25 <= speed <= 4.0:
        return api_error(400, "'speed' must be a number from 0.25 to 4.0", "bad_message")
    return text, str(fmt), float(speed)


async def _cleanup(redis: Redis, room: str, *, finished: bool) -> None:
    names = [keys.room_output(room), keys.room_utterances(room), keys.room_seq(room), keys.room_state(room),
             keys.room_senders(room)]
    pipe = redis.pipeline(transaction=False)
    if finished:
        pipe.delete(*names)
    else:  # the worker may still write: let the keys expire after it is surely done
        for name in names:
            pipe.expire(name, ABANDONED_TTL_S)
    pipe.zrem(keys.ROOMS, room)
    try:
        await pipe.execute()
    except (RedisError, OSError) as exc:
        log.warning("could not clean up private room %s: %s", room, exc)


async def _body(reader: _Room, encoder: Encoder) -> AsyncIterator[bytes]:
    try:
        while slices := await reader.read():
            out = b"".join(encoder.feed(s) for s in slices)
            if out:
                yield out
        reader.finished = True
        tail = encoder.finish()
        if tail:
            yield tail
        if reader.status != "ok":
            log.warning("speech room %s ended %s: %s", reader.room, reader.status, reader.error)
    except TimeoutError as exc:
        log.warning("speech: %s; ending the response early", exc)


class _SpeechResponse(StreamingResponse):
    """Gives the stream slot back and cleans the room up however the response ends: also when the
    client is gone before the body started (a body generator that never ran has no ``finally``)."""

    def __init__(self, reader: _Room, encoder: Encoder, limiter: _Limiter, media_type: str,
                 headers: dict[str, str]) -> None:
        super().__init__(_body(reader, encoder), media_type=media_type, headers=headers)
        self._reader = reader
        self._limiter = limiter

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._limiter.active -= 1
            # Possibly inside a cancelled scope (client gone): clean up outside that cancellation.
            with anyio.CancelScope(shield=True):
                await _cleanup(self._reader.redis, self._reader.room, finished=self._reader.finished)


def _authorize(request: Request, state: GatewayState) -> Response | None:
    """``None`` when the caller may synthesize, else the 401/403 to answer."""
    if state.settings.insecure_dev:
        return None
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    try:
        if scheme.lower() != "bearer":
            raise tokens.TokenError("token required: Authorization: Bearer <token>")
        grant = tokens.verify(state.settings.jwt_secret or "", token.strip(), API_ROOM)
    except tokens.TokenError as exc:
        return api_error(401, str(exc), "invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
    if not grant.can_speak:
        return api_error(403, "a listener token cannot synthesize speech", "forbidden")
    return None


async def _speech(request: Request, limiter: _Limiter) -> Response:
    state: GatewayState = request.app.state.voxroom
    denied = _authorize(request, state)
    if denied is not None:
        return denied
    body = await read_json(request)
    if isinstance(body, Response):
        return body
    options = _options(body)
    if isinstance(options, Response):
        return options
    text, fmt, speed = options
    try:
        voice = _voice(state, body)
    except UnknownVoice as exc:
        return api_error(400, f"{exc}; see GET /v1/voices", "unknown_voice")
    except ProtocolError as exc:
        return api_error(400, exc.message, exc.code)
    encoder = make_encoder(fmt, speed)  # validated above: raises nothing here
    if limiter.active >= limiter.limit or state.draining:
        log.warning("speech: %d streams open, refusing another", limiter.active)
        return api_error(503, "too many speech requests; retry later", "busy", kind="server_error",
                         headers={"Retry-After": "1"})
    room = f"{keys.PRIVATE_ROOM_PREFIX}{uuid.uuid4().hex}"
    redis: Redis = state.hub.redis
    try:
        outcome = await state.ingress.say(room, SENDER, 1, text, voice.id)
    except (RedisError, OSError) as exc:
        log.warning("speech: redis unavailable: %s", exc)
        return api_error(503, "server unavailable; retry later", "unavailable", kind="server_error",
                         headers={"Retry-After": "2"})
    if outcome.status != "accepted":  # a fresh room has no backlog: only a full job stream does this
        await _cleanup(redis, room, finished=True)
        return api_error(503, "server busy; retry later", "busy", kind="server_error", headers={"Retry-After": "1"})
    assert state.streams is not None, "the lifespan makes it"
    reader = _Room(redis, room, state.streams)
    limiter.active += 1
    try:
        # Wait for the first audio before answering, so that a failure is a status, not an empty body.
        reader.buffered = await reader.read()
    except TimeoutError:
        limiter.active -= 1
        await _cleanup(redis, room, finished=False)
        return api_error(503, "no worker produced audio in time; retry later", "timeout", kind="server_error",
                         headers={"Retry-After": "5"})
    except BaseException:
        limiter.active -= 1
        with anyio.CancelScope(shield=True):
            await _cleanup(redis, room, finished=False)
        raise
    # From here the keys exist: give them a TTL at once, so that even a gateway that dies
    # mid-stream leaves nothing behind for good (and the room leaves vx:rooms now).
    await _cleanup(redis, room, finished=False)
    if not reader.buffered and reader.status != "ok":
        limiter.active -= 1
        await _cleanup(redis, room, finished=True)
        return api_error(500, f"synthesis failed: {reader.error or reader.status}", "synthesis_failed",
                         kind="server_error")
    log.info("speech: room %s voice %s format %s speed %.2f, %d characters", room, voice.id, fmt, speed, len(text))
    return _SpeechResponse(reader, encoder, limiter, CONTENT_TYPES[fmt], {"X-Voxroom-Voice": voice.id})


def routes(settings: Settings) -> list[Route]:
    limiter = _Limiter(settings.speech_max_streams)

    async def speech(request: Request) -> Response:
        return await _speech(request, limiter)

    return [Route("/v1/audio/speech", speech, methods=["POST"])]
