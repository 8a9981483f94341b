"""A room output stream's entries as Redis returns them (RESP2, read raw), turned into what
clients get: the binary frame as it is, ``start`` / ``end`` as JSON."""

from __future__ import annotations

import json
from typing import Any

from voxroom.protocol import CODEC_OPUS, ROOM_RATE


def control_message(fields: dict[bytes, bytes]) -> str | None:
    """The client's JSON for a ``start`` or ``end`` entry of a room's output stream."""
    kind = fields.get(b"kind")
    if kind == b"start":
        msg: dict[str, Any] = {
            "type": "start", "utterance": int(fields[b"seq"]), "sender": fields.get(b"sender", b"").decode(),
            "voice": fields.get(b"voice", b"").decode(), "text": fields.get(b"text", b"").decode(),
            "pts_ms": float(fields.get(b"pts_ms", b"0")), "sample_rate": int(fields.get(b"rate", ROOM_RATE)),
        }
        if fields.get(b"restart"):
            msg["restart"] = True
    elif kind == b"end":
        msg = {"type": "end", "utterance": int(fields[b"seq"]), "chunks": int(fields.get(b"chunks", b"0")),
               "duration_ms": float(fields.get(b"duration_ms", b"0")),
               "status": fields.get(b"status", b"ok").decode()}
        if b"error" in fields:
            msg["error"] = fields[b"error"].decode()
    else:
        return None
    return json.dumps(msg, ensure_ascii=False, separators=(",", ":"))


def fields(flat: list[Any] | None) -> dict[Any, Any]:
    """A stream entry's ``[field, value, field, value...]`` as a dict (RESP2, as read raw)."""
    return dict(zip(flat[::2], flat[1::2], strict=True)) if flat else {}


def entry_id_str(entry_id: Any) -> str:
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def client_items(entries: list[Any], codec: int) -> list[str | bytes]:
    """What a client with ``codec`` gets for raw ``entries`` (``[[id, [field, value...]]...]``)."""
    items: list[str | bytes] = []
    for _entry_id, flat in entries:
        entry = fields(flat)
        frame = entry.get(b"frame")
        if frame is not None:
            opus = entry.get(b"opus")
            items.append(opus if opus is not None and codec == CODEC_OPUS else frame)
            continue
        text = control_message(entry)
        if text is not None:
            items.append(text)
    return items
