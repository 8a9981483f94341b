"""``say``'s ``lexicon`` (voxroom/voices/line_lexicon.py), bytes in: what is accepted, what is refused
with ``bad_message`` and why, and the job stream's form of it read back by the worker."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import msgpack
import pytest

from voxroom.voices import line_lexicon
from voxroom.wire.jobs import Job
from voxroom.wire.protocol import ErrorCode, ProtocolError, Say, decode_client_frame, parse_client_message


def say(lexicon: object, raw: str | None = None) -> Say:
    frame = raw if raw is not None else json.dumps({"type": "say", "seq": 3, "text": "The GM wakes.",
                                                    "lexicon": lexicon}, ensure_ascii=False)
    msg = parse_client_message(decode_client_frame(frame))
    assert isinstance(msg, Say)
    return msg


def refused(lexicon: object = None, raw: str | bytes | None = None) -> str:
    frame = raw if raw is not None else json.dumps({"type": "say", "seq": 3, "text": "Hi.", "lexicon": lexicon})
    with pytest.raises(ProtocolError) as info:
        parse_client_message(decode_client_frame(frame))
    assert info.value.code == ErrorCode.BAD_MESSAGE
    assert not info.value.fatal
    return info.value.message


def test_a_small_map_is_taken_trimmed() -> None:
    msg = say({"GM": " game master ", "Werewolf   King": "the wolf king", "重庆": "虫庆"})
    assert msg.lexicon == {"GM": "game master", "Werewolf King": "the wolf king", "重庆": "虫庆"}
    assert say(None).lexicon is None
    assert say({}).lexicon is None  # an empty map is no override
    assert parse_client_message({"type": "say", "seq": 1, "text": "Hi."}) == Say(seq=1, text="Hi.")


def test_the_bounds_are_exact() -> None:
    most = {f"w{i}": "x" * line_lexicon.MAX_VALUE_CHARS for i in range(line_lexicon.MAX_ENTRIES)}
    assert say(most).lexicon == most
    assert say({"k" * line_lexicon.MAX_KEY_CHARS: "v"}).lexicon is not None
    assert "at most 16" in refused({f"w{i}": "x" for i in range(line_lexicon.MAX_ENTRIES + 1)})
    assert "1-64" in refused({"k" * (line_lexicon.MAX_KEY_CHARS + 1): "v"})
    assert "1-128" in refused({"GM": "x" * (line_lexicon.MAX_VALUE_CHARS + 1)})


@pytest.mark.parametrize(("lexicon", "why"), [
    (["GM", "game master"], "must be an object"),
    ("GM=game master", "must be an object"),
    ({"GM": 3}, "must be a string"),
    ({"GM": None}, "must be a string"),
    ({"GM": ""}, "1-128"),
    ({"GM": "   "}, "1-128"),
    ({"": "nothing"}, "1-64"),
    ({"GM": "[[g'eI]]"}, "bracket"),
    ({"GM": "game [pause:300] master"}, "bracket"),
    ({"GM": "<break time=\"1s\"/>"}, "bracket"),
    ({"G[M]": "gm"}, "bracket"),
    ({"GM": "game\nmaster"}, "control character"),
    ({"G\tM": "gm"}, "control character"),
    ({"Seer": "a", "Seer ": "c"}, "given twice"),
    ({"Werewolf King": "a", "Werewolf  King": "b"}, "given twice"),
    ({"straße": "a", "strasse": "b"}, "given twice"),
])
def test_malformed_maps_are_refused_with_the_reason(lexicon: Any, why: str) -> None:
    assert why in refused(lexicon)


def test_lone_surrogates_in_keys_or_values_are_refused() -> None:
    for body in ['{"\\ud800": "x"}', '{"GM": "game \\udfff master"}']:
        raw = '{"type": "say", "seq": 3, "text": "Hi.", "lexicon": ' + body + "}"
        assert "surrogate" in refused(raw=raw)
    # msgpack: a CESU-encoded surrogate is not UTF-8 at all.
    packed = msgpack.packb({"type": "say", "seq": 3, "text": "Hi.", "lexicon": {"GM": "x"}})
    assert "not valid UTF-8" in refused(raw=packed.replace(b"\xa1x", b"\xa3\xed\xa0\x80"))
    # The parser itself refuses them too, for callers that skip the frame decoder.
    with pytest.raises(line_lexicon.BadLexicon, match="surrogate"):
        line_lexicon.parse({"GM": "\ud800"})


def test_the_job_stream_carries_it_to_the_worker() -> None:
    entries = {"Werewolf King": "the wolf king", "GM": "game master", "重庆": "虫庆"}
    fields = {"room": "r", "seq": "4", "text": "The GM.", "voice": "en-espeak", "time": "1",
              "lexicon": line_lexicon.encode(entries)}
    assert Job.from_entry("1-0", fields).lexicon == entries
    del fields["lexicon"]
    assert Job.from_entry("1-0", fields).lexicon == {}
    assert line_lexicon.encode({}) == ""
    # A field the gateway would refuse (hand-written, or an older gateway's) is dropped, not the line.
    for bad in ["{not json", '["GM"]', json.dumps({"GM": "[[x]]"}), json.dumps({f"k{i}": "v" for i in range(17)})]:
        fields["lexicon"] = bad
        job = Job.from_entry("1-0", fields)
        assert job.lexicon == {} and job.text == "The GM."


def test_the_js_clients_say_carries_it_as_the_gateway_reads_it() -> None:
    node = shutil.which("node")
    assert node is not None, "the test command needs Node (npm test runs on it too)"
    script = ("const p = await import(process.argv[1]);\n"
              "process.stdout.write(JSON.stringify([p.encodeSay(4, 'The GM.', 'en-espeak', undefined, "
              "{GM: 'game master', 重庆: '虫庆'}), p.encodeSay(5, 'Hi.', 'en-espeak', undefined, {})]));")
    module = (Path(__file__).resolve().parents[2] / "client_js" / "protocol.js").as_uri()
    done = subprocess.run([node, "--input-type=module", "-e", script, module], capture_output=True, text=True,
                          timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    with_lexicon, without = (parse_client_message(decode_client_frame(f)) for f in json.loads(done.stdout))
    assert with_lexicon == Say(seq=4, text="The GM.", voice="en-espeak", lexicon={"GM": "game master", "重庆": "虫庆"})
    assert without == Say(seq=5, text="Hi.", voice="en-espeak")
