"""The wire protocol, sans I/O: bytes and strings in, typed messages out (and back).

This module imports no asyncio, starlette or redis, so that it can be tested by feeding it bytes
and reused by any transport. docs/protocol.md describes the same thing for client authors.

Control messages are JSON objects in text frames; a client may send the same objects msgpack-encoded
in binary frames instead. Audio goes from server to client only, as binary frames laid out by
:class:`AudioFrame` (fixed 32-byte big-endian header, the room id, then the payload).
"""

from __future__ import annotations

import json
import math
import re
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, NotRequired, TypedDict

import msgpack

from voxroom.voices import line_lexicon, markup
from voxroom.voices.languages import UnknownLanguage, normalize_language

PROTOCOL_VERSION: Final = 1
ROOM_RATE: Final = 24_000
"""Every room plays at 24 kHz (ChatTTS's native rate); engines are resampled to it."""
SLICE_MS: Final = 40
SLICE_SAMPLES: Final = ROOM_RATE * SLICE_MS // 1000

MAX_TEXT_CHARS: Final = 500
MAX_FRAME_BYTES: Final = 8 * 1024
MAX_VOICE_CHARS: Final = 64
MAX_SEQ: Final = 2**53 - 1  # JSON-safe integer range: JavaScript clients must round-trip it.
MAX_SAY_SEQ: Final = 2**31 - 1
"""A ``say``'s own ``seq`` is 1..this. Far more lines than any client speaks, yet a client cannot jump
its dedupe high-water mark out of reach (2**53-1 once made every later line a ``duplicate``)."""
# \Z, not $: a bare $ also matches before a trailing newline ("room\n" would pass).
ROOM_ID_RE: Final = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
VOICE_RE: Final = re.compile(r"^[A-Za-z0-9_.:+-]{1,64}\Z")
SCENE_KEY_RE: Final = re.compile(r"^[a-z][a-z0-9_]{0,31}\Z")
SURROGATE_RE: Final = re.compile(r"[\ud800-\udfff]")
"""A lone surrogate: JSON's ``"\\ud800"`` (or a bad escape pair) decodes to one, and a string holding
it cannot be encoded as UTF-8 (not to Redis, not back to the client)."""
CONTROL_CHARS_RE: Final = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
"""C0 controls and DEL, except tab, line feed and carriage return (a say's text may hold those)."""
MAX_OPEN_LINE_CHARS: Final = 4000
"""An open line's whole text (``say`` with ``open``, then its ``append`` parts), markup included."""
MAX_LINE_PARTS: Final = 1000
"""Most ``append`` parts of one open line (and flushes: every piece counts)."""
MAX_AUDIENCE: Final = 12
"""Most client ids a private line (``say`` with ``to``) may name: a werewolf room's players."""
MAX_CLIENT_ID_CHARS: Final = 64
MAX_SCENE_TAGS: Final = 16
MAX_SCENE_VALUE_CHARS: Final = 64

CODEC_PCM16: Final = 0
CODEC_OPUS: Final = 1
CODEC_NAMES: Final = {CODEC_PCM16: "pcm16", CODEC_OPUS: "opus"}
CODECS_BY_NAME: Final = {name: code for code, name in CODEC_NAMES.items()}

FLAG_FIRST: Final = 0x01
FLAG_LAST: Final = 0x02


class ErrorCode:
    """Error codes carried by ``error`` messages (and ``synthesis_failed`` by a failed ``end``).
    Clients switch on these strings; client_js/protocol.js declares the same set (a test checks)."""

    BAD_JSON: Final = "bad_json"  # the text frame is not a JSON object
    BAD_MSGPACK: Final = "bad_msgpack"  # the binary frame is not a msgpack map (closes with 1003)
    BAD_MESSAGE: Final = "bad_message"  # a field is missing or has the wrong type or range
    UNKNOWN_TYPE: Final = "unknown_type"
    TEXT_TOO_LONG: Final = "text_too_long"
    EMPTY_TEXT: Final = "empty_text"
    UNKNOWN_VOICE: Final = "unknown_voice"
    UNKNOWN_LANGUAGE: Final = "unknown_language"  # a scene's language that languages.py cannot map
    FRAME_TOO_LARGE: Final = "frame_too_large"
    DUPLICATE: Final = "duplicate"  # a say whose seq was already accepted: ignored, not spoken twice
    SEQ_TOO_OLD: Final = "seq_too_old"  # a say far below the client's last stored seq: stored or not, unknown
    BUSY: Final = "busy"  # the room or the pool is full: retry after ``retry_after_ms``
    RATE_LIMITED: Final = "rate_limited"
    FORBIDDEN: Final = "forbidden"  # e.g. a listener token tried to speak, or to cancel another's line
    NOT_FOUND: Final = "not_found"  # a cancel for a line that is not in the room or already finished
    SYNTHESIS_FAILED: Final = "synthesis_failed"  # on a failed ``end``: the engine could not finish the line
    UNAVAILABLE: Final = "unavailable"  # Redis unreachable for a moment: retry after ``retry_after_ms``
    INTERNAL: Final = "internal"  # the gateway failed on this frame (a bug, logged); the connection stays


ERROR_CODES: Final = frozenset(value for name, value in vars(ErrorCode).items() if name.isupper())


class CloseCode:
    """WebSocket close codes the gateway uses (RFC 6455 section 7.4 and the IANA registry)."""

    NORMAL: Final = 1000
    GOING_AWAY: Final = 1001
    UNSUPPORTED_DATA: Final = 1003  # binary garbage on the control channel
    INVALID_DATA: Final = 1007  # a text frame that is not UTF-8 (uvicorn closes it: RFC 6455 8.1)
    POLICY_VIOLATION: Final = 1008  # bad room id, bad or missing token, origin refused
    MESSAGE_TOO_BIG: Final = 1009
    INTERNAL_ERROR: Final = 1011
    SERVICE_RESTART: Final = 1012  # graceful shutdown: reconnect at once
    TRY_AGAIN_LATER: Final = 1013  # gateway full: reconnect with backoff


class ProtocolError(Exception):
    """A client message that cannot be accepted. ``fatal`` errors close the connection."""

    def __init__(self, code: str, message: str, *, seq: int | None = None, fatal: bool = False,
                 retry_after_ms: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.seq = seq
        self.fatal = fatal
        self.retry_after_ms = retry_after_ms


# ---------------------------------------------------------------------------------------------
# Client -> server messages
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Say:
    """Speak ``text`` to the room. ``seq`` is the sender's own counter: strictly increasing per
    connection identity; a repeated or older ``seq`` is ignored (idempotent resend)."""

    seq: int
    text: str
    voice: str | None = None
    scene: Mapping[str, str] | None = None
    """Tags (``{"emotion": "angry", "language": "yue"}``) the gateway resolves to the best voice
    instead of naming one (docs/voices.md). At most one of ``voice`` and ``scene``."""
    lexicon: Mapping[str, str] | None = None
    """Words respelled for this line only, over the deployment's lexicon (voxroom/voices/line_lexicon.py
    has the bounds). ``None``: none."""
    to: tuple[str, ...] | None = None
    """A private line's audience: the client ids (as ``start.sender`` shows them) that receive it,
    besides its sender; sorted, each once. ``None``: the whole room."""
    open: bool = False
    """An open line: more text follows in ``append`` parts (docs/protocol.md, "Lines streamed in").
    Its ``text`` is taken as sent (not stripped: the parts are joined as they come) and may be empty."""
    type: Literal["say"] = "say"


@dataclass(frozen=True, slots=True)
class Append:
    """More text for the sender's open line ``seq``: part ``part`` (1, 2, 3... in order). ``final``
    closes the line (its ``text`` may then be empty)."""

    seq: int
    part: int
    text: str
    final: bool = False
    type: Literal["append"] = "append"


@dataclass(frozen=True, slots=True)
class Flush:
    """Speak what the sender's open line ``seq`` holds now, even mid-sentence; answered
    ``flushed`` once that audio is published."""

    seq: int
    type: Literal["flush"] = "flush"


@dataclass(frozen=True, slots=True)
class Ping:
    """Clock probe: the server answers ``pong`` with its room-clock time."""

    t: float | None = None
    type: Literal["ping"] = "ping"


@dataclass(frozen=True, slots=True)
class Resume:
    """After a reconnect: replay the room's audio after (utterance ``seq``, ``chunk``)."""

    seq: int
    chunk: int
    type: Literal["resume"] = "resume"


@dataclass(frozen=True, slots=True)
class Cancel:
    """Stop lines of the room: one by its room number (``utterance``), one of the sender's own by
    its ``say`` seq (``seq``), or every line not yet finished that this client may cancel (``all``).
    Exactly one of the three. Its own lines a sender may always cancel; any line, a ``host``."""

    utterance: int | None = None
    seq: int | None = None
    all: bool = False
    room: str | None = None
    """Optional: the room the lines are in. A socket cancels lines of its own room only: another
    room named here is refused (``bad_message``), never taken for this one."""
    type: Literal["cancel"] = "cancel"


ClientMessage = Say | Ping | Resume | Cancel | Append | Flush


def decode_client_frame(data: str | bytes) -> dict[str, Any]:
    """Turn one WebSocket frame into a raw message object.

    Text frames are JSON; binary frames are msgpack. Raises :class:`ProtocolError` with
    ``BAD_JSON`` (recoverable) or ``BAD_MSGPACK`` (fatal: binary garbage closes with 1003), or
    ``FRAME_TOO_LARGE``.
    """
    size = len(data.encode("utf-8") if isinstance(data, str) else data)
    if size > MAX_FRAME_BYTES:
        raise ProtocolError(ErrorCode.FRAME_TOO_LARGE, f"frame of {size} bytes exceeds {MAX_FRAME_BYTES}")
    if isinstance(data, str):
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError) as exc:
            raise ProtocolError(ErrorCode.BAD_JSON, f"not JSON: {exc}") from None
        if not isinstance(obj, dict):
            raise ProtocolError(ErrorCode.BAD_JSON, "a message must be a JSON object")
        # Only an escape can put a surrogate in: a text frame itself is valid UTF-8.
        if "\\u" in data:
            check_encodable(obj)
        return obj
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except UnicodeDecodeError:
        # A well-formed map whose strings are not UTF-8 (a CESU-encoded surrogate, say): a bad
        # field, not binary garbage, so the connection stays.
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "a string is not valid UTF-8") from None
    except Exception as exc:  # msgpack raises a zoo of types (ExtraData, FormatError, ValueError...)
        raise ProtocolError(ErrorCode.BAD_MSGPACK, f"binary frame is not msgpack: {type(exc).__name__}",
                            fatal=True) from None
    if not isinstance(obj, dict):
        raise ProtocolError(ErrorCode.BAD_MSGPACK, "a msgpack message must be a map", fatal=True)
    return obj


def encodable(text: str) -> bool:
    """``text`` can be encoded as UTF-8 (it holds no lone surrogate)."""
    return SURROGATE_RE.search(text) is None


def check_encodable(value: object) -> None:
    """Raise :class:`ProtocolError` (``bad_message``) when any string in ``value`` (a decoded JSON
    or msgpack document: keys, values, nested lists and maps) cannot be encoded as UTF-8.

    Every string a client sends ends up encoded somewhere (a Redis command, an error message that
    echoes it, a log line); one that cannot be once hung the connection, so it is refused here,
    at the edge, for every field of every message, known or not. Iterative: a document nested
    as deep as the decoder allows does not recurse."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if not encodable(item):
                raise ProtocolError(ErrorCode.BAD_MESSAGE, "a string holds a lone surrogate (not valid Unicode)")
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list | tuple):
            stack.extend(item)


def _int_field(obj: dict[str, Any], name: str, *, minimum: int = 0, maximum: int = MAX_SEQ) -> int:
    value = obj.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"'{name}' must be an integer")
    if not minimum <= value <= maximum:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, f"'{name}' must be between {minimum} and {maximum}")
    return value


def parse_client_message(obj: dict[str, Any]) -> ClientMessage:
    """Validate a raw message object. Raises :class:`ProtocolError` naming the first problem.

    The caller must have passed ``obj`` through :func:`decode_client_frame` (or
    :func:`check_encodable`): strings are taken to be encodable here."""
    kind = obj.get("type")
    if kind == "say":
        return _parse_say(obj)
    if kind == "append":
        return _parse_append(obj)
    if kind == "flush":
        return Flush(seq=_int_field(obj, "seq", minimum=1, maximum=MAX_SAY_SEQ))
    if kind == "ping":
        t = obj.get("t")
        if t is not None and (isinstance(t, bool) or not isinstance(t, int | float)):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "'t' must be a number")
        # t is echoed in the pong: a huge int would raise OverflowError here, and NaN or Infinity
        # would make the pong invalid JSON for browsers.
        if t is not None:
            try:
                t = float(t)
            except OverflowError:
                t = math.inf
            if not math.isfinite(t):
                raise ProtocolError(ErrorCode.BAD_MESSAGE, "'t' must be a finite number")
        return Ping(t=t)
    if kind == "resume":
        return Resume(seq=_int_field(obj, "seq"), chunk=_int_field(obj, "chunk"))
    if kind == "cancel":
        return _parse_cancel(obj)
    if not isinstance(kind, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "'type' must be a string")
    raise ProtocolError(ErrorCode.UNKNOWN_TYPE, f"unknown message type {kind[:32]!r}")


def _parse_say(obj: dict[str, Any]) -> Say:
    seq = _int_field(obj, "seq", minimum=1, maximum=MAX_SAY_SEQ)
    opened = obj.get("open", False)
    if not isinstance(opened, bool):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "'open' must be true or false", seq=seq)
    text = obj.get("text", "" if opened else None)
    if not isinstance(text, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "'text' must be a string", seq=seq)
    if opened:
        check_piece(text, seq=seq)
    else:
        text = text.strip()
        if not text:
            raise ProtocolError(ErrorCode.EMPTY_TEXT, "'text' is empty", seq=seq)
        if CONTROL_CHARS_RE.search(text):
            # Nothing speaks them, and a NUL makes the espeak phonemizer raise mid-synthesis.
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "'text' has control characters", seq=seq)
        check_say_text(text, seq=seq)
    voice = obj.get("voice")
    if voice is not None and (not isinstance(voice, str) or not VOICE_RE.match(voice)):
        raise ProtocolError(ErrorCode.UNKNOWN_VOICE, "'voice' must be a catalog voice id", seq=seq)
    scene = parse_scene(obj.get("scene"), seq=seq)
    if scene is not None and voice is not None:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "give 'voice' or 'scene', not both", seq=seq)
    try:
        lexicon = line_lexicon.parse(obj.get("lexicon"))
    except line_lexicon.BadLexicon as exc:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, str(exc), seq=seq) from None
    return Say(seq=seq, text=text, voice=voice, scene=scene, lexicon=lexicon or None,
               to=parse_audience(obj["to"], seq=seq) if "to" in obj else None, open=opened)


def _parse_append(obj: dict[str, Any]) -> Append:
    seq = _int_field(obj, "seq", minimum=1, maximum=MAX_SAY_SEQ)
    part = _int_field(obj, "part", minimum=1, maximum=MAX_LINE_PARTS)
    final = obj.get("final", False)
    if not isinstance(final, bool):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "'final' must be true or false", seq=seq)
    text = obj.get("text", "")
    if not isinstance(text, str):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "'text' must be a string", seq=seq)
    if not text and not final:
        raise ProtocolError(ErrorCode.EMPTY_TEXT, "an append without text must be final", seq=seq)
    check_piece(text, seq=seq)
    return Append(seq=seq, part=part, text=text, final=final)


def check_piece(text: str, *, seq: int | None = None) -> None:
    """One piece of an open line (its ``say``'s text, or an ``append``'s), taken as sent: no control
    characters but tab, LF and CR, markup whole within the piece (a pause split over two parts is
    ``bad_message``), at most :data:`MAX_TEXT_CHARS` to speak. The whole line's bound
    (:data:`MAX_OPEN_LINE_CHARS`) is the store's to check: only it sees every part."""
    if CONTROL_CHARS_RE.search(text):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "'text' has control characters", seq=seq)
    try:
        script = markup.parse(text)
    except markup.MarkupError as exc:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, str(exc), seq=seq) from None
    if len(script.spoken) > MAX_TEXT_CHARS:
        raise ProtocolError(ErrorCode.TEXT_TOO_LONG, f"a piece has {len(script.spoken)} characters to speak; "
                            f"the limit is {MAX_TEXT_CHARS} a piece", seq=seq)


def parse_audience(value: object, *, seq: int | None = None) -> tuple[str, ...]:
    """A ``say``'s ``to``: 1 to :data:`MAX_AUDIENCE` client ids, each one a client could have
    (what ``start.sender`` shows); sorted, duplicates once. Raises :class:`ProtocolError`
    (``bad_message``) otherwise: an empty list is a mistake, not "nobody"."""
    if not isinstance(value, list) or not 1 <= len(value) <= MAX_AUDIENCE:
        raise ProtocolError(ErrorCode.BAD_MESSAGE,
                            f"'to' must be a list of 1 to {MAX_AUDIENCE} client ids", seq=seq)
    for client in value:
        if not isinstance(client, str) or not ROOM_ID_RE.match(client):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "'to' holds a string that is no client id "
                                f"(1 to {MAX_CLIENT_ID_CHARS} of A-Z a-z 0-9 _ -)", seq=seq)
    return tuple(sorted(set(value)))


def _parse_cancel(obj: dict[str, Any]) -> Cancel:
    given = [name for name in ("utterance", "seq", "all") if name in obj]
    if len(given) != 1:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "a cancel names exactly one of 'utterance', 'seq' and 'all'")
    room = obj.get("room")
    if room is not None and (not isinstance(room, str) or not ROOM_ID_RE.match(room)):
        raise ProtocolError(ErrorCode.BAD_MESSAGE, "'room' must be a room id")
    if given == ["all"]:
        if obj["all"] is not True:
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "'all' must be true")
        return Cancel(all=True, room=room)
    if given == ["seq"]:
        seq = _int_field(obj, "seq", minimum=1, maximum=MAX_SAY_SEQ)
        return Cancel(seq=seq, room=room)
    return Cancel(utterance=_int_field(obj, "utterance", minimum=1), room=room)


def check_say_text(text: str, *, seq: int | None = None) -> None:
    """Refuse a line's markup and length as every door must (``say``, ``/v1/audio/speech``).

    Markup that is not understood (voxroom/voices/markup.py) is ``bad_message``, never spoken; the
    :data:`MAX_TEXT_CHARS` limit counts the spoken text, markup excluded (the frame size still
    bounds the whole); a line that is only pauses is ``empty_text``. ``text`` is stripped."""
    try:
        script = markup.parse(text)
    except markup.MarkupError as exc:
        raise ProtocolError(ErrorCode.BAD_MESSAGE, str(exc), seq=seq) from None
    spoken = len(script.spoken)
    if spoken > MAX_TEXT_CHARS:
        raise ProtocolError(ErrorCode.TEXT_TOO_LONG,
                            f"text has {spoken} characters to speak; the limit is {MAX_TEXT_CHARS}", seq=seq)
    if not spoken:
        raise ProtocolError(ErrorCode.EMPTY_TEXT, "'text' has pauses but nothing to say", seq=seq)


def parse_scene(value: object, *, seq: int | None = None) -> dict[str, str] | None:
    """Validate a scene: a non-empty object of at most :data:`MAX_SCENE_TAGS` lower-case tag names
    to non-empty strings. ``None`` stays ``None``. Raises :class:`ProtocolError` (``bad_message``;
    ``unknown_language`` when its ``language`` tag names no language voxroom/voices/languages.py knows)."""
    if value is None:
        return None
    if not isinstance(value, dict) or not value or len(value) > MAX_SCENE_TAGS:
        raise ProtocolError(ErrorCode.BAD_MESSAGE,
                            f"'scene' must be an object of 1-{MAX_SCENE_TAGS} tags", seq=seq)
    scene: dict[str, str] = {}
    for key, tag in value.items():
        if not isinstance(key, str) or not SCENE_KEY_RE.match(key):
            raise ProtocolError(ErrorCode.BAD_MESSAGE, "scene tag names are 1-32 of a-z 0-9 _", seq=seq)
        if not isinstance(tag, str) or not tag.strip() or len(tag) > MAX_SCENE_VALUE_CHARS:
            raise ProtocolError(ErrorCode.BAD_MESSAGE,
                                f"scene tag {key!r} must be a string of 1-{MAX_SCENE_VALUE_CHARS} characters",
                                seq=seq)
        scene[key] = tag.strip()
    language = scene.get("language")
    if language is not None:
        # Refused here, at the edge, so that every door (``say``, /v1/voices/search,
        # /v1/audio/speech) answers the same: an unknown language is never spoken by the nearest
        # voice of some other language.
        try:
            normalize_language(language)
        except UnknownLanguage as exc:
            raise ProtocolError(ErrorCode.UNKNOWN_LANGUAGE, str(exc), seq=seq) from None
    return scene


def valid_room_id(room: str) -> bool:
    return bool(ROOM_ID_RE.match(room))


# ---------------------------------------------------------------------------------------------
# Server -> client control messages (JSON text frames)
# ---------------------------------------------------------------------------------------------


class Welcome(TypedDict):
    type: Literal["welcome"]
    protocol: int
    room: str
    client: str
    sample_rate: int
    slice_ms: int
    voice: str
    server_ms: float
    codec: str
    """``pcm16`` or ``opus``: what the client asked for with ``?codec=`` (audio frames still say
    their own codec in their header)."""
    role: Literal["speaker", "listener", "host"]
    """What the token allows: ``host`` may also cancel other clients' lines (every client is one
    when auth is off, ``--insecure-dev``)."""
    lead_ms: int
    """How far ahead of its presentation time audio is published (the client's buffer target)."""
    claim: NotRequired[str]
    """Only for a client that named itself (``?client=``): the secret of its id's claim. Sent back
    as ``?claim=`` on reconnect, it takes the id over at once (app/room/identity.py)."""


class Accepted(TypedDict):
    type: Literal["accepted"]
    seq: int  # the client's seq
    utterance: int  # the room-level seq it was given


class Start(TypedDict):
    type: Literal["start"]
    utterance: int
    sender: str
    voice: str
    text: str
    pts_ms: float
    sample_rate: int
    restart: NotRequired[bool]
    """Present (true) when a worker died mid-utterance and another begins it again from chunk 0:
    drop what was received of the first take."""
    private: NotRequired[bool]
    """Present (true) on a private line (``say`` with ``to``): only its audience and its sender
    get anything of it. Who else is in the audience is not said."""


class WordMark(TypedDict):
    """One word of a ``marks`` message: when it plays and where it is in ``start.text``."""

    text: str
    start_ms: float
    """Room-clock time the word begins: the presentation time of the audio frame that holds it plus
    its offset within that frame (``start.pts_ms`` plus its offset in the utterance, unless the
    worker moved the rest of a slow line later)."""
    end_ms: float
    offset: int
    """Position in ``start.text`` in Unicode code points (Python ``str`` indices; JavaScript
    clients index ``Array.from(text)``)."""
    length: int


class Marks(TypedDict):
    """Word timings of an utterance, sent before the audio they describe (one or more per
    utterance, in order)."""

    type: Literal["marks"]
    utterance: int
    words: list[WordMark]


EndStatus = Literal["ok", "failed", "cancelled"]
END_STATUSES: Final[tuple[EndStatus, ...]] = ("ok", "failed", "cancelled")
MAX_END_ERROR_CHARS: Final = 200


class End(TypedDict):
    type: Literal["end"]
    utterance: int
    chunks: int
    duration_ms: float
    status: EndStatus
    code: NotRequired[str]
    """Only when ``failed``: :attr:`ErrorCode.SYNTHESIS_FAILED`."""
    error: NotRequired[str]
    """Only when ``failed``: why, in a short message for logs (at most :data:`MAX_END_ERROR_CHARS`)."""


class Error(TypedDict):
    type: Literal["error"]
    code: str
    message: str
    seq: NotRequired[int]
    retry_after_ms: NotRequired[int]


class Cancelled(TypedDict):
    type: Literal["cancelled"]
    utterances: list[int]
    """The room numbers of the lines the ``cancel`` stopped, sorted (empty: ``all`` found none)."""


class Text(TypedDict):
    """A piece of an open line, as it is spoken: ``offset`` is where it starts in the line's whole
    text (``start.text`` is the first piece), in code points, as marks count them."""
    type: Literal["text"]
    utterance: int
    offset: int
    text: str


class Flushed(TypedDict):
    """To an open line's sender only: the audio of everything through part ``part`` of its line
    ``seq`` (its ``say`` seq) is published (the answer to its ``flush``)."""
    type: Literal["flushed"]
    seq: int
    part: int


class Pong(TypedDict):
    type: Literal["pong"]
    t: float | None
    server_ms: float


ServerMessage = Welcome | Accepted | Start | Marks | End | Error | Pong | Cancelled | Text | Flushed
SERVER_MESSAGES: Final[Mapping[str, type[Any]]] = {
    "welcome": Welcome, "accepted": Accepted, "start": Start, "marks": Marks, "end": End, "error": Error,
    "pong": Pong, "cancelled": Cancelled, "text": Text, "flushed": Flushed}
"""Every server -> client control message by its ``type`` (client_js/protocol.js declares the same:
tests/protocol/test_js_agreement.py). ``start``, ``marks`` and ``end`` travel from the workers
through the room's output stream: voxroom/wire/output_entries.py."""
CLIENT_MESSAGES: Final[Mapping[str, type[ClientMessage]]] = {"say": Say, "ping": Ping, "resume": Resume,
                                                             "cancel": Cancel, "append": Append, "flush": Flush}


def encode_server_message(msg: ServerMessage) -> str:
    return json.dumps(msg, ensure_ascii=False, separators=(",", ":"))


def error_message(code: str, message: str, *, seq: int | None = None,
                  retry_after_ms: int | None = None) -> Error:
    err: Error = {"type": "error", "code": code, "message": message}
    if seq is not None:
        err["seq"] = seq
    if retry_after_ms is not None:
        err["retry_after_ms"] = retry_after_ms
    return err


def start_message(utterance: int, *, sender: str, voice: str, text: str, pts_ms: float,
                  restart: bool = False, private: bool = False) -> Start:
    """An utterance's ``start``. ``restart``: a second take after its worker died (chunk 0 again).
    ``private``: a line only its audience hears (``say`` with ``to``)."""
    msg: Start = {"type": "start", "utterance": utterance, "sender": sender, "voice": voice, "text": text,
                  "pts_ms": round(pts_ms, 3), "sample_rate": ROOM_RATE}
    if restart:
        msg["restart"] = True
    if private:
        msg["private"] = True
    return msg


def end_message(utterance: int, *, chunks: int, duration_ms: float, error: str | None = None,
                cancelled: bool = False) -> End:
    """An utterance's ``end``: ``ok``, or ``failed`` with ``synthesis_failed`` and ``error`` (cut to
    :data:`MAX_END_ERROR_CHARS`) when ``error`` is given; what was published before the failure
    (``chunks``) was sent and plays. ``cancelled``: a ``cancel`` cut it after ``chunks`` slices
    (the cut point)."""
    status: EndStatus = "cancelled" if cancelled else "failed" if error else "ok"
    msg: End = {"type": "end", "utterance": utterance, "chunks": chunks, "duration_ms": round(duration_ms, 1),
                "status": status}
    if error and not cancelled:
        msg["code"] = ErrorCode.SYNTHESIS_FAILED
        msg["error"] = error[:MAX_END_ERROR_CHARS]
    return msg


def cancelled_message(utterances: Iterable[int]) -> Cancelled:
    """The answer to a ``cancel``: the room numbers of the lines it cancelled (sorted; empty for an
    ``all`` that found nothing to cancel)."""
    return {"type": "cancelled", "utterances": sorted(utterances)}


def marks_message(utterance: int, words: Iterable[WordMark]) -> Marks:
    """Word marks already on the room clock (see :class:`WordMark`); times rounded to the µs."""
    return {"type": "marks", "utterance": utterance,
            "words": [{"text": w["text"], "start_ms": round(w["start_ms"], 3), "end_ms": round(w["end_ms"], 3),
                       "offset": w["offset"], "length": w["length"]} for w in words]}


# ---------------------------------------------------------------------------------------------
# Audio frames (binary, server -> client)
# ---------------------------------------------------------------------------------------------

AUDIO_MAGIC: Final = b"VX"
_HEADER = struct.Struct(">2sBBBBHIIIQI")
AUDIO_HEADER_BYTES: Final = _HEADER.size  # 32


@dataclass(frozen=True, slots=True)
class AudioFrame:
    """One slice of a room's audio.

    ``seq`` is the room-level utterance number, ``chunk`` the slice index inside it (from 0),
    ``pts_us`` the presentation time on the room clock (microseconds since the Unix epoch, as
    kept by the server), ``samples`` the slice length in samples per channel.
    """

    room: str
    seq: int
    chunk: int
    pts_us: int
    sample_rate: int
    samples: int
    payload: bytes
    codec: int = CODEC_PCM16
    channels: int = 1
    first: bool = False
    last: bool = False

    @property
    def duration_us(self) -> int:
        return self.samples * 1_000_000 // self.sample_rate

    def encode(self) -> bytes:
        room = self.room.encode("utf-8")
        flags = (FLAG_FIRST if self.first else 0) | (FLAG_LAST if self.last else 0)
        header = _HEADER.pack(AUDIO_MAGIC, PROTOCOL_VERSION, self.codec, flags, self.channels, len(room),
                              self.sample_rate, self.seq, self.chunk, self.pts_us, self.samples)
        return header + room + self.payload

    @classmethod
    def decode(cls, data: bytes) -> AudioFrame:
        """Parse a binary audio frame. Raises ``ValueError`` when it is not one."""
        if len(data) < AUDIO_HEADER_BYTES:
            raise ValueError(f"audio frame too short: {len(data)} bytes")
        (magic, version, codec, flags, channels, room_len, rate, seq, chunk, pts_us,
         samples) = _HEADER.unpack_from(data)
        if magic != AUDIO_MAGIC:
            raise ValueError("not an audio frame (bad magic)")
        if version != PROTOCOL_VERSION:
            raise ValueError(f"unsupported audio frame version {version}")
        end = AUDIO_HEADER_BYTES + room_len
        if len(data) < end:
            raise ValueError("audio frame truncated inside the room id")
        return cls(room=data[AUDIO_HEADER_BYTES:end].decode("utf-8"), seq=seq, chunk=chunk, pts_us=pts_us,
                   sample_rate=rate, samples=samples, payload=bytes(data[end:]), codec=codec,
                   channels=channels, first=bool(flags & FLAG_FIRST), last=bool(flags & FLAG_LAST))
