"""``POST /v1/audio/speech``: OpenAI's text-to-speech endpoint, on the same workers and cache.

The request becomes utterances in a private room (``_api-<uuid>``): one, or, for an input past
the room limit (up to OpenAI's 4096 characters), one per line cut by the sentence splitter, said in
order and streamed as one body (app/api/speech_room.py). Each goes through the same
``say`` script (so the same back-pressure), the same job stream, the same workers, the same audio
cache. The gateway reads that room's output stream itself and streams the audio as it comes,
encoded to ``response_format``, with chunked transfer. Workers publish private rooms unpaced
(nobody plays them in real time), so the response ends as soon as synthesis does.

``POST /v1/audio/speech/captioned`` (and Kokoro-FastAPI's ``/dev/captioned_speech``) is the same
request, checked and opened by the same functions (:func:`checked`, :func:`opened`), answered
with the audio and its word timestamps as JSON (app/api/captioned.py).

When it ends the room's keys are deleted; when the caller goes away first, they are set to expire
instead (the worker may still be publishing into them) and the room is dropped from ``vx:rooms``.
A ``200`` body is the whole audio or visibly broken: a response that cannot be finished ends
without its terminating chunk (app/api/speech_stream.py), and a line restarted by another worker is
never said twice (app/api/speech_takes.py).

Auth (unless ``--insecure-dev``): ``Authorization: Bearer <token>``, where OpenAI clients put
their API key, holding a room token (voxroom/wire/tokens.py) with role ``speaker`` for the room
``_api`` or ``*``: mint one with ``voxroom token``. Missing or bad: 401; a listener: 403.

Load shedding: at most ``speech_max_streams`` responses at once per gateway, and at most
``speech_max_streams_per_client`` of them for one token subject or one client address
(:func:`owners`); past either, 503 with ``Retry-After`` (``busy``, ``client_busy``); the slot is
taken with no await after the check. A response whose client reads nothing for
``send_stall_close_s`` is aborted and its slot freed. Errors have OpenAI's shape
(``{"error": {"message", "type", "param", "code"}}``), unexpected ones included (app/api/openai_compat.py).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any, NamedTuple

import anyio
from redis.exceptions import RedisError
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

from app.api import captioned, openai_compat
from app.api.openai_compat import mixed_voice, openai_voice
from app.api.speech_formats import (
    CONTENT_TYPES,
    MAX_SPEED,
    MIN_SPEED,
    Encoder,
    available_formats,
    make_encoder,
    refusal,
)
from app.api.speech_room import MAX_INPUT_CHARS, RoomBusy, SpeechRoom, StreamSlots, split_input
from app.api.speech_stream import SpeechStream
from app.api.voices_api import api_error, json_errors, read_json, served
from app.ingress.voice_search import resolve_scene
from app.room.admission import ban_address
from voxroom.errors import ResponseCut, UnknownVoice
from voxroom.runtime.settings import Settings
from voxroom.store import keys
from voxroom.voices import mix as voice_mix
from voxroom.voices.catalog import Voice
from voxroom.wire import tokens
from voxroom.wire.protocol import ErrorCode, ProtocolError, check_say_text, parse_scene

if TYPE_CHECKING:
    from app.state import GatewayState

log = logging.getLogger("voxroom.gateway.speech")

API_ROOM = "_api"
"""What a token's ``room`` claim names to allow this endpoint (``*`` allows it too)."""
MAX_BODY_BYTES = 64 * 1024
"""4096 characters as JSON, each possibly a 12-byte escaped surrogate pair, fit."""


def _voice(state: GatewayState, body: dict[str, Any]) -> Voice | Response:
    """The catalog voice the request names: a catalog id, an OpenAI voice name, or a ``scene``
    (a voxroom extension); else the 400 to answer."""
    try:
        scene = parse_scene(body.get("scene"))
        voice = body.get("voice")
        if scene is not None:
            return resolve_scene(state.catalog, scene, lambda v: served(state, v))
        if voice is None:
            return state.catalog.get(None)
        if not isinstance(voice, str):
            raise UnknownVoice(str(voice)[:64])
        if voice_mix.is_mix(voice):
            return mixed_voice(state, voice)
        return openai_voice(state, voice)
    except voice_mix.BadMix as exc:
        return api_error(400, str(exc), exc.code, param="voice")
    except UnknownVoice as exc:
        return api_error(400, f"{exc}; see GET /v1/audio/voices", "unknown_voice", param="voice")
    except ProtocolError as exc:
        return api_error(400, exc.message, exc.code, param="scene")


def _options(body: dict[str, Any]) -> tuple[list[str], str, float] | Response:
    """``(lines, response_format, speed)`` or the 400 to answer."""
    text = body.get("input")
    if not isinstance(text, str) or not text.strip():
        return api_error(400, "'input' must be a non-empty string", "empty_text", param="input")
    text = text.strip()
    if len(text) > MAX_INPUT_CHARS:
        return api_error(400, f"'input' has {len(text)} characters; the limit is {MAX_INPUT_CHARS}",
                         "text_too_long", param="input")
    lines = [text]
    try:  # the same markup and length rules as a room's say (voxroom/voices/markup.py)
        check_say_text(text)
    except ProtocolError as exc:
        if exc.code != ErrorCode.TEXT_TOO_LONG:
            return api_error(400, exc.message.replace("'text'", "'input'"), exc.code, param="input")
        lines = split_input(text)  # more to say than one line takes: several, in order
        for line in lines:
            try:
                check_say_text(line)
            except ProtocolError as cut:  # e.g. a pause tag cut in two by the splitter
                return api_error(400, cut.message.replace("'text'", "'input'"), cut.code, param="input")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        return api_error(400, "'model' must be a string", "bad_message", param="model")
    formats = available_formats()
    fmt = body.get("response_format", "mp3" if "mp3" in formats else "wav")
    if body.get("stream_format", "audio") != "audio":
        return api_error(400, "only stream_format 'audio' is supported", "unsupported_format", param="stream_format")
    speed = body.get("speed", 1.0)
    if isinstance(speed, bool) or not isinstance(speed, int | float) or not MIN_SPEED <= speed <= MAX_SPEED:
        return api_error(400, f"'speed' must be a number from {MIN_SPEED} to {MAX_SPEED}", "bad_message",
                         param="speed")
    refused = refusal(fmt, float(speed))
    if refused is not None:
        message, code, param = refused
        return api_error(400, message, code, param=param)
    return lines, str(fmt), float(speed)


async def _body(reader: SpeechRoom, encoder: Encoder) -> AsyncIterator[bytes]:
    """The encoded audio; raises :class:`~voxroom.errors.ResponseCut` when it cannot be whole."""
    async for slices in reader.batches():
        out = b"".join(encoder.feed(s) for s in slices)
        if out:
            yield out
    tail = encoder.finish()
    if tail:
        yield tail


async def release(reader: SpeechRoom, slots: StreamSlots) -> None:
    """Give the stream slot back and clean the room up (deleted when it finished, else left to
    expire); safe inside a cancelled scope (the client gone)."""
    slots.release(reader.owners)
    with anyio.CancelScope(shield=True):
        await reader.cleanup(finished=reader.finished)


def _authorize(request: Request, state: GatewayState) -> Response | str | None:
    """The token's subject (``None``: it has none, or auth is off) when the caller may
    synthesize, else the 401/403 to answer."""
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
    return grant.subject or None


def owners(request: Request, subject: str | None) -> tuple[str, ...]:
    """Whom a request's stream slot counts against for the per-client share: its token's
    subject, and its client address (the one the flood ban uses: none behind a proxy uvicorn
    does not trust, where every client would share the proxy's)."""
    address = ban_address(request)
    return ((f"sub:{subject}",) if subject else ()) + ((f"addr:{address}",) if address else ())


class Speech(NamedTuple):
    """A request's checked parts: what to say, how, in what voice, and for whom."""

    lines: list[str]
    fmt: str
    speed: float
    voice: Voice
    body: dict[str, Any]
    owners: tuple[str, ...] = ()
    """What its stream slot counts against (:func:`owners`)."""


async def checked(request: Request) -> Speech | Response:
    """The request authorized, read and checked (``POST /v1/audio/speech``'s body), or the
    401/403/400 to answer."""
    state: GatewayState = request.app.state.voxroom
    subject = _authorize(request, state)
    if isinstance(subject, Response):
        return subject
    body = await read_json(request, MAX_BODY_BYTES)
    if isinstance(body, Response):
        return body
    options = _options(body)
    if isinstance(options, Response):
        return options
    voice = _voice(state, body)
    if isinstance(voice, Response):
        return voice
    return Speech(*options, voice, body, owners(request, subject))


async def opened(request: Request, slots: StreamSlots, speech: Speech, *, marks: bool = False) -> SpeechRoom | Response:
    """The private room saying ``speech``, holding a stream slot and its first audio, or the
    503/500 to answer (the slot given back). The caller gives the slot back with :func:`release`.
    ``marks``: keep the lines' word marks (:attr:`SpeechRoom.words`)."""
    state: GatewayState = request.app.state.voxroom
    # The slot is taken with no await since the check: a burst never passes the limit.
    taken = "full" if state.draining else slots.reserve(speech.owners)
    if taken == "full":
        log.warning("speech: %d streams open, refusing another", slots.active)
        return api_error(503, "too many speech requests; retry later", "busy", headers={"Retry-After": "1"})
    if taken == "share":
        log.warning("speech: %s holds %d streams, its share of this gateway's %d; refusing another",
                    " / ".join(speech.owners), slots.per_client, slots.limit)
        return api_error(503, f"you hold {slots.per_client} speech streams on this gateway, the most one client "
                         "may; retry when one ends", "client_busy", headers={"Retry-After": "1"})
    room = f"{keys.PRIVATE_ROOM_PREFIX}{uuid.uuid4().hex}"
    assert state.streams is not None, "the lifespan makes it"
    reader = SpeechRoom(state.hub.control, room, state.store.layout.room_index(room), state.streams, state.ingress,
                        speech.voice.id, speech.lines, keep_marks=marks, owners=speech.owners)
    refused: Response | None = None
    try:
        # Wait for the first audio before answering, so that a failure is a status, not an empty body.
        reader.buffered = await reader.read()
    except (RedisError, OSError) as exc:
        log.warning("speech: redis unavailable: %s", exc)
        refused = api_error(503, "server unavailable; retry later", "unavailable", headers={"Retry-After": "2"})
    except RoomBusy:  # a fresh room has no backlog: only a full job stream does this
        refused = api_error(503, "server busy; retry later", "busy", headers={"Retry-After": "1"})
    except TimeoutError:
        refused = api_error(503, "no worker produced audio in time; retry later", "timeout",
                            headers={"Retry-After": "5"})
    except ResponseCut as exc:  # the first line's entries damaged or restarted unlike itself: say it again
        log.warning("speech: %s", exc)
        refused = api_error(503, f"synthesis interrupted ({exc.reason}); retry", "unavailable",
                            headers={"Retry-After": "1"})
    except BaseException:
        await release(reader, slots)
        raise
    if refused is not None:
        slots.release(reader.owners)
        await reader.cleanup(finished=False)
        return refused
    # From here the keys exist: give them a TTL at once, so that even a gateway that dies
    # mid-stream leaves nothing behind for good (and the room leaves vx:rooms now).
    await reader.cleanup(finished=False)
    if not reader.buffered and reader.status != "ok":
        slots.release(reader.owners)
        await reader.cleanup(finished=True)
        return api_error(500, f"synthesis failed: {reader.error or reader.status}", "synthesis_failed")
    log.info("speech: room %s voice %s format %s speed %.2f, %d line(s), %d characters", room, speech.voice.id,
             speech.fmt, speech.speed, len(speech.lines), sum(len(line) for line in speech.lines))
    return reader


def stream(request: Request, reader: SpeechRoom, slots: StreamSlots, body: AsyncIterator[bytes], media_type: str,
           headers: dict[str, str]) -> Response:
    """A chunked response of ``body`` that releases ``reader``'s slot and room however it ends,
    cut visibly when it cannot end whole, and aborted when its client stops reading
    (app/api/speech_stream.py)."""
    settings = request.app.state.voxroom.settings

    async def on_end() -> None:
        await release(reader, slots)

    return SpeechStream(body, media_type=media_type, headers=headers, name=reader.room,
                        stall_s=settings.send_stall_close_s, send_buffer_bytes=settings.send_buffer_bytes,
                        on_end=on_end)


async def _speech(request: Request, slots: StreamSlots) -> Response:
    speech = await checked(request)
    if isinstance(speech, Response):
        return speech
    encoder = make_encoder(speech.fmt, speech.speed)  # refusal() said yes: raises nothing here
    reader = await opened(request, slots, speech)
    if isinstance(reader, Response):
        return reader
    return stream(request, reader, slots, _body(reader, encoder), CONTENT_TYPES[speech.fmt],
                  {"X-Voxroom-Voice": speech.voice.id})


async def _captioned(request: Request, slots: StreamSlots) -> Response:
    """The same request with word timestamps (app/api/captioned.py), as NDJSON or one JSON object."""
    speech = await checked(request)
    if isinstance(speech, Response):
        return speech
    how = captioned.options(speech.body)
    if isinstance(how, Response):
        return how
    encoder = make_encoder(speech.fmt, speech.speed)
    reader = await opened(request, slots, speech, marks=how.timestamps)
    if isinstance(reader, Response):
        return reader
    captions = captioned.Captions(reader, speech.body["input"], speech.speed) if how.timestamps else None
    headers = {"X-Voxroom-Voice": speech.voice.id}
    if how.stream:
        return stream(request, reader, slots, captioned.ndjson(reader, encoder, speech.fmt, captions),
                      captioned.NDJSON_TYPE, headers)
    try:
        return await captioned.whole(reader, encoder, speech.fmt, captions, headers)
    finally:
        await release(reader, slots)


def routes(settings: Settings) -> list[BaseRoute]:
    """The speech routes (one stream cap for both), then the OpenAI extras (app/api/openai_compat.py),
    whose ``/v1`` catch-all must stay last. Captioned speech also answers at Kokoro-FastAPI's path."""
    slots = StreamSlots(settings.speech_max_streams, settings.speech_max_streams_per_client)

    @json_errors
    async def speech(request: Request) -> Response:
        return await _speech(request, slots)

    @json_errors
    async def captioned_speech(request: Request) -> Response:
        return await _captioned(request, slots)

    return [Route("/v1/audio/speech", speech, methods=["POST"]),
            Route("/v1/audio/speech/captioned", captioned_speech, methods=["POST"]),
            Route("/dev/captioned_speech", captioned_speech, methods=["POST"]),
            *openai_compat.routes()]
