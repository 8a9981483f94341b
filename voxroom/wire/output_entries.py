"""A room's output stream, sans I/O: the entries workers append and gateways turn into client messages.

One entry per ``start``, ``marks`` and ``end`` message and one per audio slice (``chunk``), in the
order clients get them. Workers build entries only from the messages of :mod:`voxroom.wire.protocol`
(:func:`entry_fields`), and gateways turn them back into those messages (:func:`control_from_entry`),
so a field exists on the wire exactly when the protocol declares it. Every entry has ``kind`` and
``seq`` (the utterance). Field names are those of the first protocol 1 workers, so gateways read
entries written before and after an upgrade alike. Control entries hold the message's fields,
renamed where noted::

    start  seq, sender, voice, text, pts_ms, rate (the sample rate), restart (1, only when true),
           private (1, only when true)
    marks  seq, words (the message's ``words``, compact JSON)
    end    seq, chunks, duration_ms, status, code and error (only when failed), pts_ms (where the
           room's audio now ends: for ``voxroom rooms``; clients do not get it)
    chunk  seq, chunk, frame (the binary audio frame), opus (the same slice Opus-encoded; optional)
    text   seq, offset, text (a piece of an open line, as it is spoken)
    flushed  seq, line (the sender's ``say`` seq), part; ``to`` the sender (its answer to a flush)

Entries that name no line (no ``seq``) tell the workers something and reach no client: ``cancel``
(the lines a cancel named) and ``piece`` (an open line got a part).

Every entry of a private line (``say`` with ``to``) also has ``to``: its audience, the client ids
that may get it (its sender's among them) separated by spaces. Gateways send such an entry to those
clients only (:func:`audience`); the workers' job bus adds the field (voxroom/store/jobs.py).

A ``chunk`` entry may hold several consecutive slices of one utterance (a paced worker publishes
an utterance's slices after the first in groups, one entry per group: docs/protocol.md):
``slices`` says how many (absent: one), ``chunk`` is the first one's index, ``frame``/``opus``
hold the first slice and ``frame1``/``opus1``, ``frame2``/``opus2``... the next ones. Clients get
one WebSocket frame per slice either way (:func:`slice_frames`). A gateway from before grouped
entries would send only each group's first slice: upgrade gateways before workers.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

from voxroom.wire.protocol import END_STATUSES, ROOM_RATE, End, ErrorCode, Flushed, Marks, Start, Text

AUDIENCE_FIELD = "to"
EntryFields = dict[str, str | int | bytes]
"""An entry as written (redis-py ``XADD`` fields, or the publish script's field pairs)."""
ControlMessage = Start | Marks | End | Text | Flushed


def entry_fields(msg: ControlMessage, *, room_end_ms: float | None = None) -> EntryFields:
    """The output-stream entry of a control message. ``room_end_ms`` is for an ``end`` only."""
    if msg["type"] == "start":
        fields: EntryFields = {"kind": "start", "seq": msg["utterance"], "sender": msg["sender"],
                               "voice": msg["voice"], "text": msg["text"], "pts_ms": f"{msg['pts_ms']:.3f}",
                               "rate": msg["sample_rate"]}
        if msg.get("restart"):
            fields["restart"] = 1
        if msg.get("private"):
            fields["private"] = 1
        return fields
    if msg["type"] == "marks":
        return {"kind": "marks", "seq": msg["utterance"],
                "words": json.dumps(msg["words"], ensure_ascii=False, separators=(",", ":"))}
    if msg["type"] == "text":
        return {"kind": "text", "seq": msg["utterance"], "offset": msg["offset"], "text": msg["text"]}
    if msg["type"] == "flushed":
        raise ValueError("a flushed entry names its utterance too: flushed_fields()")
    fields = {"kind": "end", "seq": msg["utterance"], "chunks": msg["chunks"],
              "duration_ms": f"{msg['duration_ms']:.1f}", "status": msg["status"]}
    if "code" in msg:
        fields["code"] = msg["code"]
    if "error" in msg:
        fields["error"] = msg["error"]
    if room_end_ms is not None:
        fields["pts_ms"] = f"{room_end_ms:.3f}"
    return fields


def flushed_fields(utterance: int, msg: Flushed, sender: str) -> EntryFields:
    """The entry of a ``flushed`` answer: in the line's utterance (``seq``, so a resume scan reads
    it in its place), for the sender only (``to``)."""
    return {"kind": "flushed", "seq": utterance, "line": msg["seq"], "part": msg["part"], AUDIENCE_FIELD: sender}


def chunk_fields(seq: int, chunk: int, frame: bytes, opus: bytes | None = None) -> EntryFields:
    """The entry of one audio slice: its encoded :class:`voxroom.wire.protocol.AudioFrame`, and
    optionally the same slice as an Opus frame (gateways pick per client)."""
    fields: EntryFields = {"kind": "chunk", "seq": seq, "chunk": chunk, "frame": frame}
    if opus is not None:
        fields["opus"] = opus
    return fields


MAX_GROUP = 8
"""Most slices in one ``chunk`` entry."""
FRAME_FIELDS = (b"frame", *(f"frame{i}".encode() for i in range(1, MAX_GROUP)))
OPUS_FIELDS = (b"opus", *(f"opus{i}".encode() for i in range(1, MAX_GROUP)))


def group_fields(seq: int, chunk: int, frames: Sequence[bytes], opus: Sequence[bytes] | None = None) -> EntryFields:
    """The entry of consecutive slices ``chunk``, ``chunk + 1``... (one to :data:`MAX_GROUP`):
    their encoded frames, and optionally their Opus copies (one per frame). One slice gives the
    same entry as :func:`chunk_fields`."""
    if not 1 <= len(frames) <= MAX_GROUP or (opus is not None and len(opus) != len(frames)):
        raise ValueError(f"a chunk entry holds 1 to {MAX_GROUP} slices, each with its Opus copy or none")
    fields: EntryFields = {"kind": "chunk", "seq": seq, "chunk": chunk}
    if len(frames) > 1:
        fields["slices"] = len(frames)
    for i, frame in enumerate(frames):
        fields[FRAME_FIELDS[i].decode()] = frame
        if opus is not None:
            fields[OPUS_FIELDS[i].decode()] = opus[i]
    return fields


def audience(fields: Mapping[bytes, bytes]) -> frozenset[str] | None:
    """Who may get an entry (raw, as Redis returns it): the client ids of a private line's ``to``
    field, or ``None``: everyone in the room."""
    to = fields.get(b"to")
    return None if to is None else frozenset(to.decode(errors="replace").split())


def slice_count(fields: Mapping[bytes, bytes]) -> int:
    """How many slices a ``chunk`` entry (raw, as Redis returns it) holds; ``ValueError`` when
    its ``slices`` field is not 1 to :data:`MAX_GROUP`."""
    n = fields.get(b"slices")
    if n is None:
        return 1
    count = int(n)
    if not 1 <= count <= MAX_GROUP:
        raise ValueError(f"chunk entry with {count} slices")
    return count


def slice_frames(fields: Mapping[bytes, bytes], opus: bool = False, skip: int = 0) -> list[bytes]:
    """A ``chunk`` entry's frames as clients get them, one per slice in order, after the first
    ``skip``: each slice's Opus copy when ``opus`` and the entry has it, its PCM frame otherwise.
    Raises ``ValueError`` for a malformed entry (a slice without its frame)."""
    frames: list[bytes] = []
    for i in range(skip, slice_count(fields)):
        frame = fields.get(OPUS_FIELDS[i]) if opus else None
        if frame is None:
            frame = fields.get(FRAME_FIELDS[i])
        if frame is None:
            raise ValueError(f"chunk entry without its slice {i}")
        frames.append(frame)
    return frames


def control_from_entry(fields: Mapping[bytes, bytes]) -> ControlMessage | None:
    """The client message of an entry as Redis returns it (raw bytes), or ``None`` for an entry
    that is none (a ``chunk``, a kind this gateway does not know yet). Missing fields take the
    values the first workers implied. Raises ``ValueError`` for a malformed control entry."""
    kind = fields.get(b"kind")
    try:
        if kind == b"start":
            start: Start = {
                "type": "start", "utterance": int(fields[b"seq"]), "sender": fields.get(b"sender", b"").decode(),
                "voice": fields.get(b"voice", b"").decode(), "text": fields.get(b"text", b"").decode(),
                "pts_ms": float(fields.get(b"pts_ms", b"0")), "sample_rate": int(fields.get(b"rate", ROOM_RATE))}
            if fields.get(b"restart"):
                start["restart"] = True
            if fields.get(b"private"):
                start["private"] = True
            return start
        if kind == b"end":
            status = fields.get(b"status", b"ok").decode()
            if status not in END_STATUSES:
                raise ValueError(f"end status {status!r}")
            end: End = {"type": "end", "utterance": int(fields[b"seq"]), "chunks": int(fields.get(b"chunks", b"0")),
                        "duration_ms": float(fields.get(b"duration_ms", b"0")),
                        "status": "failed" if status == "failed" else "cancelled" if status == "cancelled" else "ok"}
            if end["status"] == "failed":
                # Entries of workers from before ``code`` carry only ``error``.
                end["code"] = fields.get(b"code", ErrorCode.SYNTHESIS_FAILED.encode()).decode()
                end["error"] = fields.get(b"error", b"").decode()
            return end
        if kind == b"text":
            return {"type": "text", "utterance": int(fields[b"seq"]), "offset": int(fields[b"offset"]),
                    "text": fields[b"text"].decode()}
        if kind == b"flushed":
            return {"type": "flushed", "seq": int(fields[b"line"]), "part": int(fields[b"part"])}
        if kind == b"marks":
            words = json.loads(fields[b"words"])
            if not isinstance(words, list):
                raise ValueError("marks 'words' is not a list")
            return {"type": "marks", "utterance": int(fields[b"seq"]), "words": words}
    except (KeyError, UnicodeDecodeError) as exc:
        raise ValueError(f"malformed {kind!r} entry: {exc!r}") from None
    return None
