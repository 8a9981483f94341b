"""The private room behind one ``POST /v1/audio/speech``, and the per-gateway stream slots.

The room's output stream is read from its first entry to the last line's ``end``; which of its
audio goes into the body (a line restarted by another worker, entries gone missing) is
app/api/speech_takes.py's. Workers never trim a private room's stream (they trim a room to the
resume window by time, which a slow reader would fall behind); the response trims what it has
sent, about once a second (:func:`keep`), so the stream holds what it has not sent yet: bounded
by the response's own input, and to the :data:`WINDOW` lines said ahead of what it has read.

An input longer than a room's line limit is split (:func:`split_input`) into lines said in order
in the same private room; the worker plays a room's lines in order, so reading its output stream
from the start gives one continuous audio stream. Lines are handed to the room a few at a time
(:data:`WINDOW`), so a 4096-character input never meets the room's own back-pressure
(``max_pending_per_room``) and a caller who hangs up leaves little queued behind.

Word marks (``marks`` entries, from engines that time words) are kept as :class:`HeardWord`, on
the response's own clock: private rooms are published unpaced, so a word's time in its line is
its ``start_ms`` less the line's ``start.pts_ms``, and the line's audio begins after every sample
of the lines before it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

import numpy as np
from prometheus_client import Gauge
from redis.exceptions import RedisError

from app.api.speech_takes import Takes
from app.room.address_slots import AddressSlots
from voxroom.errors import ResponseCut, StreamGap
from voxroom.runtime import metrics
from voxroom.store import keys
from voxroom.store.interface import Commands, Ingress, StreamWatch
from voxroom.voices.text_split import split_text
from voxroom.wire.output_entries import control_from_entry, slice_frames
from voxroom.wire.protocol import MAX_TEXT_CHARS, ROOM_RATE, AudioFrame

log = logging.getLogger("voxroom.gateway.speech")

IDLE_TIMEOUT_S: Final = 30.0
"""No output from the room for this long: the utterance is given up (the worker died)."""
ABANDONED_TTL_S: Final = 300
SENDER: Final = "api"
WINDOW: Final = 4
"""Lines of one response waiting in its room at once (well under ``max_pending_per_room``). Lines
are said as the response reads their predecessors' ends, so a slow client holds its room to the
line it is reading and at most this many more (what bounds the room's output stream)."""
KEEP_EVERY_S: Final = 1.0
"""How often a reading response trims what it sent from its room and refreshes the room's TTLs."""
MAX_INPUT_CHARS: Final = 4096
"""OpenAI's input limit; each line said is at most the room limit (``MAX_TEXT_CHARS``)."""

STREAMS_OPEN = Gauge("voxroom_speech_streams", "POST /v1/audio/speech responses holding a stream slot now.",
                     registry=metrics.REGISTRY)
STREAMS_PEAK = Gauge("voxroom_speech_streams_peak",
                     "Most POST /v1/audio/speech stream slots held at once since the gateway started.",
                     registry=metrics.REGISTRY)


class HeardWord(NamedTuple):
    """One word of one line, timed from the first sample of the response's audio (at speed 1)."""

    line: int
    text: str
    start_ms: float
    end_ms: float
    offset: int
    """Code points before the word in its line (``lines[line]``)."""
    length: int


class RoomBusy(Exception):
    """The room refused a line (its backlog is full): the job stream is, for a fresh room."""


@dataclass
class StreamSlots:
    """At most ``limit`` responses at once, and at most ``per_client`` of them for any one owner
    (a token subject, a client address: app/api/speech_api.py says which a request has; 0: no share).
    :meth:`reserve` takes a slot with no await between the check and the count, so a burst can
    never pass either limit. The owners table holds one entry per owner with a slot, so it is
    bounded by ``limit``."""

    limit: int
    per_client: int = 0
    active: int = 0
    peak: int = 0
    held: AddressSlots = field(default_factory=AddressSlots)

    def reserve(self, owners: Sequence[str] = ()) -> Literal["ok", "full", "share"]:
        """``ok`` (a slot taken, counted against each of ``owners``), ``full`` (the gateway's
        slots are all held) or ``share`` (one of ``owners`` holds ``per_client`` already)."""
        if self.active >= self.limit:
            return "full"
        if any(self.held.full(owner, self.per_client) for owner in owners):
            return "share"
        for owner in owners:
            self.held.take(owner)
        self.active += 1
        self.peak = max(self.peak, self.active)
        STREAMS_OPEN.set(self.active)
        STREAMS_PEAK.set(self.peak)
        return "ok"

    def release(self, owners: Sequence[str] = ()) -> None:
        for owner in owners:
            self.held.give(owner)
        self.active -= 1
        STREAMS_OPEN.set(self.active)


def split_input(text: str) -> list[str]:
    """``text`` as lines of at most :data:`MAX_TEXT_CHARS` characters, cut at sentence ends first
    (the server's sentence splitter), then packed greedily so that a page of short sentences is
    a few lines, not one per sentence."""
    if len(text) <= MAX_TEXT_CHARS:
        return [text]
    lines: list[str] = []
    for piece in split_text(text, MAX_TEXT_CHARS):
        joined = f"{lines[-1]} {piece}" if lines else piece
        if lines and len(joined) <= MAX_TEXT_CHARS:
            lines[-1] = joined
        else:
            lines.append(piece)
    return lines


async def cleanup(commands: Commands, room: str, *, finished: bool, index: str) -> None:
    """Delete the room's keys (``finished``) or give them :data:`ABANDONED_TTL_S` (the worker may
    still write); either way drop it from its rooms index ``index`` (``Layout.room_index``: where
    ``say`` indexed it). Logs and swallows Redis failures."""
    names = [keys.room_output(room), keys.room_utterances(room), keys.room_seq(room), keys.room_state(room),
             keys.room_senders(room)]
    # The index may lie in another slot than the room's: a cluster's pipeline sends it to that node
    # in the same round trip (one per node) as the room's own commands.
    first: list[tuple[Any, ...]] = ([("DEL", *names)] if finished else
                                    [("EXPIRE", name, ABANDONED_TTL_S) for name in names])
    try:
        await commands.group([*first, ("ZREM", index, room)])
    except (RedisError, OSError) as exc:
        log.warning("could not clean up private room %s: %s", room, exc)


async def keep(commands: Commands, room: str, read_up_to: str) -> None:
    """While a response reads its room: drop the output entries before ``read_up_to`` (sent
    already; workers never trim a private room, so this is what bounds it) and give every key of
    the room :data:`ABANDONED_TTL_S` again, so that a response read for longer than that (a slow
    client, a long input) never loses its room, and a gateway that dies leaves it to expire.
    Raises ``RedisError``/``OSError``, and :class:`~voxroom.errors.StreamGap` when entries were
    read from the stream and it is gone (a Redis that restarted without it: nothing more of the
    response will ever come)."""
    names = (keys.room_utterances(room), keys.room_seq(room), keys.room_state(room), keys.room_senders(room))
    commands_: list[tuple[Any, ...]] = [("EXPIRE", keys.room_output(room), ABANDONED_TTL_S),
                                        *(("EXPIRE", name, ABANDONED_TTL_S) for name in names)]
    if read_up_to != "0-0":
        commands_.append(("XTRIM", keys.room_output(room), "MINID", read_up_to))
    replies = await commands.group(commands_)
    if read_up_to != "0-0" and not replies[0]:
        raise StreamGap(f"room {room}'s output stream is gone after entry {read_up_to} (Redis lost it)")


@dataclass
class SpeechRoom:
    """The private room's lines and its output stream as read so far."""

    commands: Commands
    """Bytes replies (the room's entries carry audio); the gateway's, not closed here."""
    room: str
    index: str
    """The rooms index ``say`` puts the room in (``Layout.room_index``)."""
    watcher: StreamWatch
    """The gateway's one blocked read: a response waits there, never on a connection of its own."""
    ingress: Ingress
    voice: str
    lines: list[str]
    cursor: str = "0-0"
    submitted: int = 0
    ended: int = 0
    chunks: int = 0
    finished: bool = False
    """Every line's ``end`` entry was read and all audio handed out."""
    status: str | None = None
    """``ok`` once every line ended well; the first other status ends the response."""
    error: str = ""
    buffered: list[np.ndarray[Any, Any]] = field(default_factory=list)
    keep_marks: bool = False
    """Keep the lines' word marks in :attr:`words` (else ``marks`` entries are skipped)."""
    words: list[HeardWord] = field(default_factory=list)
    samples: int = 0
    """Samples handed out so far (what :meth:`read` returned, and what it is about to)."""
    owners: tuple[str, ...] = ()
    """Whom its stream slot counts against (:class:`StreamSlots`), given back with it."""
    takes: Takes = field(default_factory=Takes)
    """Which of the stream's audio goes into the response (restarted lines, gaps)."""
    _line_at_ms: float = 0.0
    """Where the current line's audio begins in the response, and its ``start.pts_ms``."""
    _line_pts_ms: float = 0.0
    _kept: float = 0.0
    """When :func:`keep` last ran for this room (monotonic)."""

    @property
    def key(self) -> str:
        return keys.room_output(self.room)

    async def cleanup(self, *, finished: bool) -> None:
        """:func:`cleanup` of this room."""
        await cleanup(self.commands, self.room, finished=finished, index=self.index)

    async def top_up(self) -> None:
        """Say lines until :data:`WINDOW` wait. Raises ``RedisError``/``OSError`` or :class:`RoomBusy`."""
        said = False
        while self.submitted < len(self.lines) and self.submitted - self.ended < WINDOW:
            outcome = await self.ingress.say(self.room, SENDER, self.submitted + 1, self.lines[self.submitted],
                                             self.voice)
            if outcome.status == "busy":
                raise RoomBusy(f"room {self.room} refused line {self.submitted + 1}")
            self.submitted += 1
            said = True
        if said:  # ``say`` re-registers the room and its TTLs: keep it private and short-lived
            await self.cleanup(finished=False)
            self._kept = time.monotonic()

    async def read(self) -> list[np.ndarray[Any, Any]]:
        """The next slices (empty once the last line's ``end`` was seen, or a line failed: see
        :attr:`status`). What it returns counts as sent. Raises ``TimeoutError``,
        :class:`~voxroom.errors.StreamGap`, :class:`~voxroom.errors.TakesDiffer`, and what
        :meth:`top_up` raises."""
        if self.buffered:
            out, self.buffered = self.buffered, []
            return out
        deadline = time.monotonic() + IDLE_TIMEOUT_S
        while self.status is None:
            await self.top_up()
            if time.monotonic() - self._kept >= KEEP_EVERY_S:
                await keep(self.commands, self.room, self.cursor)
                self._kept = time.monotonic()
            got: Any = await self.commands.call("XRANGE", self.key, "(" + self.cursor, "+", "COUNT", 256)
            entries = [(entry_id, dict(zip(flat[::2], flat[1::2], strict=True))) for entry_id, flat in got or []]
            if not entries:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no audio from room {self.room} in {IDLE_TIMEOUT_S:.0f} s")
                await self.watcher.wait(self.room, self.cursor, min(1.0, left))
                continue
            slices: list[np.ndarray[Any, Any]] = []
            for entry_id, fields in entries:
                self.cursor = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                if not self._entry(fields, slices):
                    break
            if slices or self.status is not None:
                self.takes.commit()
                return slices
            if time.monotonic() > deadline:
                raise TimeoutError(f"no audio from room {self.room} in {IDLE_TIMEOUT_S:.0f} s")
        return []

    def _entry(self, fields: dict[bytes, bytes], slices: list[np.ndarray[Any, Any]]) -> bool:
        """One output entry: its audio appended to ``slices``, its words kept. ``False`` once the
        response's last line ended (well or not): nothing after it is read."""
        kind = fields.get(b"kind")
        try:
            seq = int(fields.get(b"seq", b"0"))
            if kind == b"chunk":
                first = int(fields.get(b"chunk", b"0"))
                for i, frame in enumerate(slice_frames(fields)):
                    pcm = np.frombuffer(AudioFrame.decode(frame).payload, dtype="<i2").astype(np.int16)
                    part = self.takes.audio(seq, first + i, pcm)
                    if part.size:
                        slices.append(part)
                        self.samples += int(part.size)
                    self.chunks += 1
            elif kind == b"start":
                restart = bool(fields.get(b"restart"))
                samples, words = self.takes.start(seq, restart)
                if samples or words:
                    self._drop(slices, samples, words)
                if restart:
                    log.warning("speech room %s: line %d restarted by another worker; %d of its samples were sent "
                                "(the new take must begin with them), %d read but not sent are dropped", self.room,
                                seq, self.takes.line_samples, samples)
                if self.keep_marks:
                    self._keep(fields, seq)
            elif kind == b"marks" and self.keep_marks:
                self._keep(fields, seq)
            elif kind == b"end":
                status = fields.get(b"status", b"ok").decode()
                if status != "ok":
                    self.ended += 1
                    self.status, self.error = status, fields.get(b"error", b"").decode()
                    return False
                self.takes.end(seq, int(fields.get(b"chunks", b"0")))
                self.ended += 1
                if self.ended >= len(self.lines):
                    self.status = "ok"
                    return False
        except ValueError as exc:  # a malformed entry: the audio it held cannot be had
            raise StreamGap(f"unreadable {kind!r} entry ({exc})") from None
        return True

    def _drop(self, slices: list[np.ndarray[Any, Any]], samples: int, words: int) -> None:
        """Take back the last ``samples`` handed out in ``slices`` (whole slices: they are exactly
        the restarted line's since the last read) and the last ``words`` words."""
        self.samples -= samples
        while samples > 0:
            samples -= int(slices.pop().size)
        if words:
            del self.words[-words:]

    def _keep(self, fields: dict[bytes, bytes], seq: int) -> None:
        try:
            msg = control_from_entry(fields)
        except ValueError as exc:  # a damaged entry costs its words, never the audio
            log.warning("speech room %s: %s", self.room, exc)
            return
        if msg is None:
            return
        if msg["type"] == "start":
            # A restarted line began where its first samples went out, however many of them.
            at = self.samples - self.takes.line_samples
            self._line_at_ms, self._line_pts_ms = at * 1000 / ROOM_RATE, msg["pts_ms"]
        elif msg["type"] == "marks":
            shift = self._line_at_ms - self._line_pts_ms
            words = msg["words"]
            skip = self.takes.words(seq, len(words))
            try:
                self.words += [HeardWord(self.ended, str(w["text"]), float(w["start_ms"]) + shift,
                                         float(w["end_ms"]) + shift, int(w["offset"]), int(w["length"]))
                               for w in words[skip:]]
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("speech room %s: malformed marks entry (%r)", self.room, exc)

    async def batches(self) -> AsyncIterator[list[np.ndarray[Any, Any]]]:
        """:meth:`read` until the last line ended well (then :attr:`finished` is set). Any other
        end raises :class:`~voxroom.errors.ResponseCut`: the caller's response is already under
        way, and must not end as if it were whole."""
        try:
            while slices := await self.read():
                yield slices
        except TimeoutError as exc:
            raise ResponseCut(str(exc), "timeout") from None
        except (RedisError, OSError) as exc:
            raise ResponseCut(f"redis unavailable ({exc})", "redis") from None
        except RoomBusy as exc:
            raise ResponseCut(str(exc), "busy") from None
        if self.status != "ok":
            raise ResponseCut(f"line {self.ended} ended {self.status}: {self.error}", "failed")
        self.finished = True
