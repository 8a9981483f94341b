"""Property tests on the wire protocol: whatever a client sends, the parser answers with a typed
message or a :class:`ProtocolError`, never anything else (any other exception would escape the
gateway's receive loop and kill the connection with 1011 and a traceback).

Pure: bytes and strings in, no sockets. Example counts are moderate so the file runs in seconds.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from voxroom.wire import protocol
from voxroom.wire.protocol import AudioFrame, ErrorCode, Ping, ProtocolError, Resume, Say

# No example database: it would leave a .hypothesis/ folder in the shared checkout, and these
# properties are cheap enough to search afresh every run.
FAST = settings(max_examples=300, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

ERROR_CODES = {v for k, v in vars(ErrorCode).items() if k.isupper()}


def parse(data: str | bytes) -> protocol.ClientMessage:
    return protocol.parse_client_message(protocol.decode_client_frame(data))


def assert_valid(msg: protocol.ClientMessage) -> None:
    """The invariants the gateway relies on for every message the parser lets through."""
    if isinstance(msg, Say):
        assert 1 <= msg.seq <= protocol.MAX_SAY_SEQ
        # Every string that gets through can be encoded (to Redis, back to the client, to a log).
        for text in (msg.text, msg.voice or "", *(msg.scene or {}).keys(), *(msg.scene or {}).values()):
            text.encode("utf-8")
        assert msg.text == msg.text.strip() and 1 <= len(msg.text) <= protocol.MAX_TEXT_CHARS
        assert not protocol.CONTROL_CHARS_RE.search(msg.text)  # the espeak phonemizer raises on NUL
        assert msg.voice is None or protocol.VOICE_RE.fullmatch(msg.voice)
        assert msg.voice is None or msg.scene is None
        if msg.scene is not None:
            assert 1 <= len(msg.scene) <= protocol.MAX_SCENE_TAGS
            assert all(protocol.SCENE_KEY_RE.fullmatch(k) and isinstance(v, str) and v for k, v in msg.scene.items())
    elif isinstance(msg, Ping):
        # The gateway echoes t in its pong: it must be a finite float, or the pong is not JSON
        # that a browser's JSON.parse accepts (NaN, Infinity are not JSON).
        assert msg.t is None or (isinstance(msg.t, float) and math.isfinite(msg.t))
    else:
        assert isinstance(msg, Resume)
        assert 0 <= msg.seq <= protocol.MAX_SEQ and 0 <= msg.chunk <= protocol.MAX_SEQ


def check_outcome(data: str | bytes) -> protocol.ClientMessage | ProtocolError:
    """Parse ``data``; fail the test on any exception other than ProtocolError."""
    try:
        msg = parse(data)
    except ProtocolError as exc:
        assert exc.code in ERROR_CODES
        # Only binary garbage is fatal (close 1003); a bad text frame never closes the connection.
        assert exc.fatal == (exc.code == ErrorCode.BAD_MSGPACK)
        assert isinstance(data, bytes) or not exc.fatal
        # The error goes back to the client as JSON: it must encode.
        protocol.encode_server_message(protocol.error_message(exc.code, exc.message, seq=exc.seq,
                                                              retry_after_ms=exc.retry_after_ms))
        return exc
    assert_valid(msg)
    return msg


# --- value strategies --------------------------------------------------------------------------

# Numbers a hostile client would try: edges of every integer width, the JSON-safe range, and far past.
EDGE_INTS = st.sampled_from([0, 1, -1, 2**31, 2**32, 2**53 - 1, 2**53, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)])
HUGE_INTS = st.integers(min_value=10**20, max_value=10**400).map(lambda n: n * (-1 if n % 2 else 1))
MSGPACK_INTS = st.integers(min_value=-(2**63), max_value=2**64 - 1)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
KEYS = st.sampled_from(["type", "seq", "text", "voice", "scene", "t", "chunk", "emotion"]) | st.text(max_size=8)
TYPES = st.sampled_from(["say", "ping", "resume", "SAY", "", "welcome", "error"])


LONE_SURROGATE = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF, categories=["Cs"])
"""What JSON's ``"\\ud800"`` decodes to: a str that cannot be encoded as UTF-8."""
UNENCODABLE = st.builds(lambda a, s, b: a + s + b, st.text(max_size=8), LONE_SURROGATE, st.text(max_size=8))
PACK_SURROGATES = msgpack.Packer(unicode_errors="surrogatepass")
"""Writes a surrogate as the 3 bytes UTF-8 forbids, as a hostile msgpack client can."""


def json_values(ints: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    leaves = st.none() | st.booleans() | ints | EDGE_INTS | FLOATS | st.text(max_size=40) | UNENCODABLE
    return st.recursive(leaves, lambda inner: st.lists(inner, max_size=4)
                        | st.dictionaries(KEYS, inner, max_size=4), max_leaves=12)


def message_like(ints: st.SearchStrategy[int]) -> st.SearchStrategy[dict[str, Any]]:
    """Objects shaped like client messages: a plausible (or not) type and random fields."""
    return st.builds(lambda kind, rest: {**rest, "type": kind} if kind is not None else rest,
                     st.none() | TYPES | json_values(ints),
                     st.dictionaries(KEYS, json_values(ints), max_size=6))


# --- never anything but a message or a ProtocolError -------------------------------------------


@FAST
@given(st.text(max_size=200))
@example('{"type":"ping","t":1' + "0" * 400 + "}")  # an integer too big for a float
@example('{"type":"ping","t":NaN}')
@example('{"type":"ping","t":-Infinity}')
@example("[" * 5000 + "]" * 5000)  # deeper than the JSON decoder recurses
@example('{"type":"say","seq":1,"text":"' + "x" * 9000 + '"}')
@example('{"type":"say","seq":1,"text":"hi","voice":"en-joe\\n"}')  # a newline after a valid voice id
@example('{"type":"say","seq":1,"text":"a\\u0000b"}')  # a NUL inside the text
def test_any_text_frame_gives_a_message_or_a_protocol_error(data: str) -> None:
    # st.text() holds no lone surrogates: a WebSocket text frame is valid UTF-8, so none can arrive.
    check_outcome(data)


@FAST
@given(st.binary(max_size=300))
@example(b"\xc1")  # the one byte msgpack never uses
@example(msgpack.packb({"type": "ping", "t": 2**64 - 1}))
@example(b"\x91" * 3000)  # deeply nested arrays
def test_any_binary_frame_gives_a_message_or_a_protocol_error(data: bytes) -> None:
    check_outcome(data)


@FAST
@given(message_like(HUGE_INTS | st.integers()))
def test_any_json_object_gives_a_message_or_a_protocol_error(obj: dict[str, Any]) -> None:
    check_outcome(json.dumps(obj))


@FAST
@given(message_like(MSGPACK_INTS))
def test_any_msgpack_map_gives_a_message_or_a_protocol_error(obj: dict[str, Any]) -> None:
    check_outcome(PACK_SURROGATES.pack(obj))


@FAST
@given(st.binary(min_size=1, max_size=64).map(lambda b: b"\x81\xa4type\xa3say" + b))
def test_msgpack_with_a_valid_prefix_and_garbage_after_it_is_fatal_bad_msgpack(data: bytes) -> None:
    # A binary frame is one msgpack object: trailing bytes are garbage, not a second message.
    outcome = check_outcome(data)
    if isinstance(outcome, ProtocolError):
        assert outcome.code in {ErrorCode.BAD_MSGPACK, ErrorCode.BAD_MESSAGE}


@FAST
@given(st.integers(1, 200), st.booleans())
def test_frames_over_the_cap_are_refused_before_parsing_and_not_fatal(extra: int, binary: bool) -> None:
    size = protocol.MAX_FRAME_BYTES + extra
    outcome = check_outcome(b"\xc1" * size if binary else "\u00e9" * (size // 2 + 1))
    assert isinstance(outcome, ProtocolError) and outcome.code == ErrorCode.FRAME_TOO_LARGE
    assert not outcome.fatal


@FAST
@given(st.text(max_size=70) | st.from_regex(r"[A-Za-z0-9_-]{1,64}", fullmatch=True).map(lambda s: s + "\n"))
@example("room\n")
def test_room_ids_are_exactly_1_to_64_of_the_safe_charset(room: str) -> None:
    # Room ids become Redis key parts and log fields: nothing outside the charset, not even a
    # trailing newline (which a bare ``$`` would let through), may pass.
    safe = len(room) <= 64 and bool(room) and all(c.isascii() and (c.isalnum() or c in "_-") for c in room)
    assert protocol.valid_room_id(room) == safe


# --- valid says round-trip, over JSON and msgpack alike -----------------------------------------

CONTROLS = "".join(chr(c) for c in range(0x80) if protocol.CONTROL_CHARS_RE.match(chr(c)))
# Valid text: no lone surrogates (no UTF-8 form: refused, see the surrogate properties) and no
# brackets (markup: a valid say's markup is tested in tests/engines/test_markup.py).
SAY_TEXT = st.text(st.characters(exclude_characters=CONTROLS + "[]<>", exclude_categories=("Cs",)), min_size=1,
                   max_size=protocol.MAX_TEXT_CHARS).filter(lambda s: bool(s.strip()))
VOICE = st.from_regex(protocol.VOICE_RE, fullmatch=True)
# A scene's ``language`` must name a language (else unknown_language): other tags are free text.
SCENE = st.dictionaries(st.from_regex(protocol.SCENE_KEY_RE, fullmatch=True).filter(lambda k: k != "language"),
                        st.text(st.characters(exclude_categories=("Cs",)), min_size=1,
                                max_size=protocol.MAX_SCENE_VALUE_CHARS).filter(lambda s: bool(s.strip())),
                        min_size=1, max_size=protocol.MAX_SCENE_TAGS)


@st.composite
def valid_says(draw: st.DrawFn) -> dict[str, Any]:
    obj: dict[str, Any] = {"type": "say", "seq": draw(st.integers(1, protocol.MAX_SAY_SEQ)), "text": draw(SAY_TEXT)}
    choice = draw(st.sampled_from(["none", "voice", "scene"]))
    if choice == "voice":
        obj["voice"] = draw(VOICE)
    elif choice == "scene":
        obj["scene"] = draw(SCENE)
    return obj


@FAST
@given(valid_says())
def test_valid_says_parse_the_same_from_json_and_msgpack(obj: dict[str, Any]) -> None:
    from_json = parse(json.dumps(obj, ensure_ascii=False))
    from_msgpack = parse(msgpack.packb(obj))
    assert from_json == from_msgpack
    assert isinstance(from_json, Say)
    assert_valid(from_json)
    assert from_json.seq == obj["seq"] and from_json.text == obj["text"].strip()
    assert from_json.voice == obj.get("voice")
    expected_scene = {k: v.strip() for k, v in obj["scene"].items()} if "scene" in obj else None
    assert from_json.scene == expected_scene
    # ...and parsing what was parsed gives the same message again (the validator is idempotent).
    again = {"type": "say", "seq": from_json.seq, "text": from_json.text}
    if from_json.voice is not None:
        again["voice"] = from_json.voice
    if from_json.scene is not None:
        again["scene"] = dict(from_json.scene)
    assert parse(json.dumps(again)) == from_json


@FAST
@given(st.integers(0, protocol.MAX_SEQ), st.integers(0, protocol.MAX_SEQ),
       st.none() | st.floats(allow_nan=False, allow_infinity=False) | st.integers(-(2**53), 2**53))
def test_valid_resume_and_ping_parse_the_same_from_json_and_msgpack(seq: int, chunk: int,
                                                                    t: float | int | None) -> None:
    resume = {"type": "resume", "seq": seq, "chunk": chunk}
    assert parse(json.dumps(resume)) == parse(msgpack.packb(resume)) == Resume(seq=seq, chunk=chunk)
    ping = {"type": "ping", "t": t}
    expected = Ping(t=float(t) if t is not None else None)
    assert parse(json.dumps(ping)) == parse(msgpack.packb(ping)) == expected


# --- unencodable strings: refused in every field of every message, the connection stays --------

@st.composite
def messages_with_a_lone_surrogate(draw: st.DrawFn) -> dict[str, Any]:
    """A valid say, ping or resume with one string somewhere (a known field, a scene tag, an unknown
    field's name or value, deep in a list) holding a lone surrogate."""
    kind = draw(st.sampled_from(["say", "ping", "resume", "other"]))
    if kind == "say":
        obj = draw(valid_says())
    elif kind == "ping":
        obj = {"type": "ping", "t": 1.5}
    elif kind == "resume":
        obj = {"type": "resume", "seq": 1, "chunk": 0}
    else:
        obj = {"type": draw(st.text(min_size=1, max_size=8))}
    bad = draw(UNENCODABLE)
    where = draw(st.sampled_from(["type", "text", "voice", "scene_value", "scene_key", "extra_key", "extra_value",
                                  "nested"]))
    if where == "type":
        obj["type"] = obj["type"] + bad
    elif where == "text":
        obj["text"] = "Hello " + bad
    elif where == "voice":
        obj.pop("scene", None)
        obj["voice"] = bad
    elif where == "scene_value":
        obj.pop("voice", None)
        obj["scene"] = {"emotion": "calm", "language": bad}
    elif where == "scene_key":
        obj.pop("voice", None)
        obj["scene"] = {bad: "calm"}
    elif where == "extra_key":
        obj[bad] = 1
    elif where == "extra_value":
        obj["note"] = bad
    else:
        obj["note"] = [1, {"deep": [bad]}]
    return obj


@FAST
@given(messages_with_a_lone_surrogate())
@example({"type": "say", "seq": 1, "text": "\ud800"})
@example({"type": "say", "seq": 1, "text": "hi", "scene": {"emotion": "\udfff"}})
@example({"type": "say", "seq": 1, "text": "hi", "voice": "en-joe\udc80"})
def test_a_lone_surrogate_anywhere_is_bad_message_and_not_fatal(obj: dict[str, Any]) -> None:
    for frame in (json.dumps(obj), PACK_SURROGATES.pack(obj)):
        outcome = check_outcome(frame)
        assert isinstance(outcome, ProtocolError), (frame, outcome)
        assert outcome.code == ErrorCode.BAD_MESSAGE and not outcome.fatal


def test_a_surrogate_pair_is_one_character_and_is_accepted() -> None:
    # "\ud83d\ude00" (an escaped pair) is the emoji U+1F600, not two lone surrogates.
    msg = parse('{"type":"say","seq":1,"text":"hi \\ud83d\\ude00"}')
    assert isinstance(msg, Say) and msg.text == "hi \U0001F600"


@FAST
@given(st.integers(protocol.MAX_SAY_SEQ + 1, protocol.MAX_SEQ) | st.integers(max_value=0))
def test_a_say_seq_outside_1_to_2_31_minus_1_is_bad_message(seq: int) -> None:
    # A say's seq is the dedupe high-water mark: 2**53-1 once made every later line a duplicate.
    outcome = check_outcome(json.dumps({"type": "say", "seq": seq, "text": "hi"}))
    assert isinstance(outcome, ProtocolError) and outcome.code == ErrorCode.BAD_MESSAGE
    assert isinstance(parse(json.dumps({"type": "say", "seq": protocol.MAX_SAY_SEQ, "text": "hi"})), Say)


# --- audio frames ------------------------------------------------------------------------------

U8, U32, U64 = st.integers(0, 2**8 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**64 - 1)


@FAST
@given(room=st.text(max_size=80), seq=U32, chunk=U32, pts_us=U64, sample_rate=U32, samples=U32,
       payload=st.binary(max_size=512), codec=U8, channels=U8, first=st.booleans(), last=st.booleans())
def test_audio_frames_round_trip_for_any_fields(room: str, seq: int, chunk: int, pts_us: int, sample_rate: int,
                                                samples: int, payload: bytes, codec: int, channels: int,
                                                first: bool, last: bool) -> None:
    frame = AudioFrame(room=room, seq=seq, chunk=chunk, pts_us=pts_us, sample_rate=sample_rate, samples=samples,
                       payload=payload, codec=codec, channels=channels, first=first, last=last)
    data = frame.encode()
    assert len(data) == protocol.AUDIO_HEADER_BYTES + len(room.encode()) + len(payload)
    assert AudioFrame.decode(data) == frame


@FAST
@given(st.binary(max_size=200) | st.binary(max_size=200).map(lambda b: b"VX\x01" + b))
@example(b"VX\x01\x00\x00\x01\x00\x04" + bytes(24) + b"\xff\xfe\xfd\xfc")  # room id bytes not UTF-8
@example(b"VX\x01\x00\x00\x01\xff\xff" + bytes(24))  # room id length past the end
def test_decoding_arbitrary_bytes_as_audio_raises_only_value_error(data: bytes) -> None:
    try:
        frame = AudioFrame.decode(data)
    except ValueError:
        return
    # What decodes re-encodes to the same bytes (flag bits it does not know aside): it loses nothing.
    known = protocol.FLAG_FIRST | protocol.FLAG_LAST
    assert frame.encode() == data[:4] + bytes([data[4] & known]) + data[5:]
