"""The wire protocol, fed bytes and strings: no sockets, no event loop."""

from __future__ import annotations

import json
import struct

import msgpack
import pytest

from voxroom.wire import protocol
from voxroom.wire.protocol import AudioFrame, ErrorCode, Ping, ProtocolError, Resume, Say


def parse(data: str | bytes) -> protocol.ClientMessage:
    return protocol.parse_client_message(protocol.decode_client_frame(data))


def test_audio_frame_layout_is_big_endian_header_then_room_then_payload() -> None:
    payload = bytes(range(10))
    frame = AudioFrame(room="abc", seq=7, chunk=3, pts_us=1_700_000_000_123_456, sample_rate=24000,
                       samples=5, payload=payload, first=True, last=False)
    data = frame.encode()
    assert data[:2] == b"VX" and data[2] == 1 and data[3] == protocol.CODEC_PCM16
    assert data[4] == protocol.FLAG_FIRST and data[5] == 1
    assert struct.unpack(">H", data[6:8]) == (3,)
    assert struct.unpack(">IIIQI", data[8:32]) == (24000, 7, 3, 1_700_000_000_123_456, 5)
    assert data[32:35] == b"abc" and data[35:] == payload
    assert AudioFrame.decode(data) == frame
    assert frame.duration_us == 208


@pytest.mark.parametrize("data", [b"", b"VX", b"XX" + bytes(40), b"VX\x02" + bytes(40)])
def test_audio_frame_decode_rejects_what_is_not_a_frame(data: bytes) -> None:
    with pytest.raises(ValueError):
        AudioFrame.decode(data)


def test_say_in_json_and_msgpack_parse_the_same() -> None:
    obj = {"type": "say", "seq": 4, "text": "  天黑请闭眼  ", "voice": "cmn-espeak"}
    assert parse(json.dumps(obj)) == parse(msgpack.packb(obj)) == Say(seq=4, text="天黑请闭眼", voice="cmn-espeak")
    assert parse('{"type":"ping","t":12.5}') == Ping(t=12.5)
    assert parse('{"type":"resume","seq":3,"chunk":0}') == Resume(seq=3, chunk=0)


@pytest.mark.parametrize(("data", "code"), [
    ("{not json", ErrorCode.BAD_JSON),
    ("[1,2]", ErrorCode.BAD_JSON),
    ('{"type":"say","seq":"1","text":"x"}', ErrorCode.BAD_MESSAGE),
    ('{"type":"say","seq":true,"text":"x"}', ErrorCode.BAD_MESSAGE),
    ('{"type":"say","seq":0,"text":"x"}', ErrorCode.BAD_MESSAGE),
    ('{"type":"say","seq":1,"text":5}', ErrorCode.BAD_MESSAGE),
    ('{"type":"say","seq":1,"text":"   "}', ErrorCode.EMPTY_TEXT),
    ('{"type":"say","seq":1,"text":"x","voice":"../etc"}', ErrorCode.UNKNOWN_VOICE),
    ('{"type":"sing"}', ErrorCode.UNKNOWN_TYPE),
    ('{"seq":1}', ErrorCode.BAD_MESSAGE),
    ('{"type":"say","seq":1,"text":"' + "a" * (protocol.MAX_TEXT_CHARS + 1) + '"}', ErrorCode.TEXT_TOO_LONG),
    ("x" * (protocol.MAX_FRAME_BYTES + 1), ErrorCode.FRAME_TOO_LARGE),
])
def test_bad_text_frames_are_recoverable_errors_with_a_code(data: str, code: str) -> None:
    with pytest.raises(ProtocolError) as info:
        parse(data)
    assert info.value.code == code
    assert not info.value.fatal


@pytest.mark.parametrize("data", [b"\xc1\xc1\xc1", b"\x93\x01\x02\x03", b"\xff" * 10])
def test_binary_garbage_is_fatal(data: bytes) -> None:
    with pytest.raises(ProtocolError) as info:
        parse(data)
    assert info.value.fatal and info.value.code == ErrorCode.BAD_MSGPACK


@pytest.mark.parametrize(("room", "ok"), [("village", True), ("a-b_C9", True), ("x" * 64, True),
                                          ("", False), ("x" * 65, False), ("a:b", False), ("a b", False),
                                          ("*", False), ("é", False)])
def test_room_ids(room: str, ok: bool) -> None:
    assert protocol.valid_room_id(room) is ok


def test_server_messages_are_compact_json() -> None:
    text = protocol.encode_server_message(protocol.error_message(ErrorCode.BUSY, "full", seq=3, retry_after_ms=750))
    assert json.loads(text) == {"type": "error", "code": "busy", "message": "full", "seq": 3, "retry_after_ms": 750}
