"""voxroom/wire/protocol.py and client_js/protocol.js declare the same protocol: every message type (and
its fields), every error code, every ``end`` status; and what one side builds, the other parses to
the same fields. Real Node runs the real client module (no copy of its tables here)."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgpack
import pytest

from app.fanout.entries import control_message
from voxroom.wire import protocol
from voxroom.wire.output_entries import EntryFields, entry_fields, flushed_fields
from voxroom.wire.protocol import ERROR_CODES, ErrorCode, end_message, marks_message, start_message

ROOT = Path(__file__).resolve().parents[2]
# Reads a JSON list of server frames on stdin; prints the module's tables, what parseServerMessage
# made of each frame, and one frame of each client message as the module's encoders write it.
NODE_SCRIPT = """
const p = await import(process.argv[1]);
let input = '';
for await (const chunk of process.stdin) input += chunk;
const parsed = JSON.parse(input).map((text) => {
  try { return { ok: p.parseServerMessage(text) }; } catch (err) { return { error: String(err) }; }
});
process.stdout.write(JSON.stringify({
  errorCodes: p.ErrorCode, serverFields: p.SERVER_MESSAGE_FIELDS, required: p.REQUIRED_FIELDS,
  wordMarkFields: p.WORD_MARK_FIELDS, endStatuses: p.END_STATUSES, clientTypes: p.CLIENT_MESSAGE_TYPES,
  parsed,
  client: [p.encodeSay(5, 'Night falls, 村民.', 'en-joe'), p.encodeSay(6, 'Hi', undefined, { emotion: 'calm' }),
           p.encodePing(12.5), p.encodeResume(4, 17), p.encodeCancel({ utterance: 41 }),
           p.encodeCancel({ seq: 6 }), p.encodeCancel({ all: true }),
           p.encodeSay(7, 'The wolves', 'en-joe', undefined, undefined, ['seer'], true),
           p.encodeAppend(7, 1, ' wake, and', false), p.encodeFlush(7), p.encodeAppend(7, 2, '', true)],
}));
"""


def as_redis_returns(fields: EntryFields) -> dict[bytes, bytes]:
    def b(value: str | int | bytes) -> bytes:
        return value if isinstance(value, bytes) else str(value).encode()
    return {b(k): b(v) for k, v in fields.items()}


def via_gateway(msg: protocol.Start | protocol.Marks | protocol.End | protocol.Text) -> str:
    """The frame a client gets for a control message a worker built: stream entry, then the gateway."""
    text = control_message(as_redis_returns(entry_fields(msg, room_end_ms=1.0 if msg["type"] == "end" else None)))
    assert text is not None
    return text


def server_frames() -> list[str]:
    """One frame of every server message, built where the server builds it; optional fields set."""
    welcome: protocol.Welcome = {
        "type": "welcome", "protocol": protocol.PROTOCOL_VERSION, "room": "lobby", "client": "c-ana",
        "sample_rate": protocol.ROOM_RATE, "slice_ms": protocol.SLICE_MS, "voice": "en-joe",
        "server_ms": 1764546000000.25, "codec": "opus", "role": "listener", "lead_ms": 120, "claim": "s" * 22}
    return [
        protocol.encode_server_message(welcome),
        protocol.encode_server_message({"type": "accepted", "seq": 5, "utterance": 41}),
        via_gateway(start_message(41, sender="c-ana", voice="en-joe", text="Night falls, 村民.",
                                  pts_ms=1764546000123.5, restart=True)),
        via_gateway(marks_message(41, [
            {"text": "Night", "start_ms": 1764546000123.5, "end_ms": 1764546000433.0, "offset": 0, "length": 5},
            {"text": "村民", "start_ms": 1764546000600.0, "end_ms": 1764546000900.0, "offset": 13, "length": 2}])),
        via_gateway(end_message(41, chunks=30, duration_ms=1200.0)),
        via_gateway(end_message(42, chunks=2, duration_ms=80.0, error="RuntimeError: engine gone")),
        protocol.encode_server_message(protocol.error_message(ErrorCode.BUSY, "room full", seq=6,
                                                              retry_after_ms=750)),
        protocol.encode_server_message({"type": "pong", "t": 12.5, "server_ms": 1764546000001.0}),
        protocol.encode_server_message(protocol.cancelled_message([43, 41])),
        via_gateway(end_message(41, chunks=12, duration_ms=480.0, cancelled=True)),
        via_gateway({"type": "text", "utterance": 44, "offset": 10, "text": " wake, 村民"}),
        control_message(as_redis_returns(flushed_fields(44, {"type": "flushed", "seq": 7, "part": 3}, "c-ana"))) or "",
    ]


@pytest.fixture(scope="module")
def js() -> dict[str, Any]:
    node = shutil.which("node")
    assert node is not None, "the test command needs Node (npm test runs on it too)"
    module = (ROOT / "client_js" / "protocol.js").as_uri()
    done = subprocess.run([node, "--input-type=module", "-e", NODE_SCRIPT, module],
                          input=json.dumps(server_frames()), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def _fields(typed_dict: type[Any]) -> set[str]:
    return set(typed_dict.__required_keys__) | set(typed_dict.__optional_keys__)


def test_the_same_error_codes_by_the_same_names(js: dict[str, Any]) -> None:
    python = {name: value for name, value in vars(ErrorCode).items() if name.isupper()}
    assert js["errorCodes"] == python
    assert set(js["errorCodes"].values()) == ERROR_CODES


def test_the_same_message_types_with_the_same_fields(js: dict[str, Any]) -> None:
    assert set(js["serverFields"]) == set(protocol.SERVER_MESSAGES)
    for kind, typed_dict in protocol.SERVER_MESSAGES.items():
        assert set(js["serverFields"][kind]) == _fields(typed_dict), kind
        # What the client insists on, the server always sends.
        assert set(js["required"][kind]) <= set(typed_dict.__required_keys__), kind
    assert set(js["wordMarkFields"]) == _fields(protocol.WordMark)
    assert js["endStatuses"] == list(protocol.END_STATUSES)
    assert js["clientTypes"] == list(protocol.CLIENT_MESSAGES)


def test_every_server_message_parses_in_js_to_the_same_fields(js: dict[str, Any]) -> None:
    frames = server_frames()
    assert {json.loads(f)["type"] for f in frames} == set(protocol.SERVER_MESSAGES), "one of each"
    for frame, result in zip(frames, js["parsed"], strict=True):
        assert "ok" in result, (frame, result)
        sent = json.loads(frame)
        assert result["ok"] == sent
        assert set(sent) <= set(js["serverFields"][sent["type"]]), sent
    failed = json.loads(frames[5])
    assert (failed["status"], failed["code"], failed["error"]) == ("failed", "synthesis_failed",
                                                                   "RuntimeError: engine gone")
    assert js["parsed"][8]["ok"] == {"type": "cancelled", "utterances": [41, 43]}
    cut = js["parsed"][9]["ok"]
    assert (cut["status"], cut["chunks"], "code" in cut) == ("cancelled", 12, False)
    assert js["parsed"][10]["ok"] == {"type": "text", "utterance": 44, "offset": 10, "text": " wake, 村民"}
    assert js["parsed"][11]["ok"] == {"type": "flushed", "seq": 7, "part": 3}


def test_every_client_message_js_writes_parses_in_python(js: dict[str, Any]) -> None:
    messages = [protocol.parse_client_message(protocol.decode_client_frame(text)) for text in js["client"]]
    assert messages == [protocol.Say(seq=5, text="Night falls, 村民.", voice="en-joe"),
                        protocol.Say(seq=6, text="Hi", scene={"emotion": "calm"}),
                        protocol.Ping(t=12.5), protocol.Resume(seq=4, chunk=17), protocol.Cancel(utterance=41),
                        protocol.Cancel(seq=6), protocol.Cancel(all=True),
                        protocol.Say(seq=7, text="The wolves", voice="en-joe", to=("seer",), open=True),
                        protocol.Append(seq=7, part=1, text=" wake, and"), protocol.Flush(seq=7),
                        protocol.Append(seq=7, part=2, text="", final=True)]
    assert {m.type for m in messages} == set(protocol.CLIENT_MESSAGES)
    # The same objects msgpack-encoded in binary frames, as a client may send them.
    assert [protocol.parse_client_message(protocol.decode_client_frame(msgpack.packb(json.loads(t))))
            for t in js["client"]] == messages
