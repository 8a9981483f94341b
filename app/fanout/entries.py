"""A room output stream's entries as Redis returns them (RESP2, read raw), turned into what
clients get: the binary frame as it is, control entries (``start``, ``marks``, ``end``) as the JSON
of the messages voxroom/wire/output_entries.py reads them back into."""

from __future__ import annotations

import logging
from typing import Any

from voxroom.wire.output_entries import ControlMessage, audience, control_from_entry, slice_frames
from voxroom.wire.protocol import CODEC_OPUS, encode_server_message

log = logging.getLogger("voxroom.gateway.entries")


def control(fields: dict[bytes, bytes]) -> ControlMessage | None:
    """The client message of a control entry; ``None`` for an audio entry, a kind this gateway does
    not know, or a malformed entry (logged and skipped: one bad entry must not stop a room's reader)."""
    try:
        return control_from_entry(fields)
    except ValueError as exc:
        log.warning("skipping an output entry: %s", exc)
        return None


def control_message(fields: dict[bytes, bytes]) -> str | None:
    """The client's JSON for a control entry of a room's output stream (see :func:`control`)."""
    msg = control(fields)
    return None if msg is None else encode_server_message(msg)


def fields(flat: list[Any] | None) -> dict[Any, Any]:
    """A stream entry's ``[field, value, field, value...]`` as a dict (RESP2, as read raw)."""
    return dict(zip(flat[::2], flat[1::2], strict=True)) if flat else {}


def entry_items(entry: dict[bytes, bytes], codec: int, client_id: str, skip: int = 0) -> list[str | bytes]:
    """What client ``client_id`` with ``codec`` gets for one entry: one binary frame per slice of a
    ``chunk`` entry, or a control message's JSON; minus the first ``skip`` items, which it already
    holds (a control entry is one item: ``skip=1`` gives nothing). Nothing of a private line's entry
    that does not name it (``to``), and nothing for a malformed entry (logged)."""
    allowed = audience(entry)
    if allowed is not None and client_id not in allowed:
        return []
    if b"frame" in entry:
        try:
            return list(slice_frames(entry, opus=codec == CODEC_OPUS, skip=skip))
        except ValueError as exc:
            log.warning("skipping an output entry: %s", exc)
            return []
    if skip > 0:
        return []
    text = control_message(entry)
    return [] if text is None else [text]


def client_items(entries: list[Any], codec: int, client_id: str) -> list[str | bytes]:
    """What client ``client_id`` with ``codec`` gets for raw ``entries`` (``[[id, [field,
    value...]]...]``)."""
    items: list[str | bytes] = []
    for _entry_id, flat in entries:
        items += entry_items(fields(flat), codec, client_id)
    return items
