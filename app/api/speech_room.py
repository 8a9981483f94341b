"""The private room behind one ``POST /v1/audio/speech``, and the per-gateway stream slots.

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
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, Final, NamedTuple

import numpy as np
from prometheus_client import Gauge
from redis.exceptions import RedisError

from voxroom.runtime import metrics
from voxroom.store import keys
from voxroom.store.interface import Commands, Ingress, StreamWatch
from voxroom.voices.text_split import split_text
from voxroom.wire.output_entries import control_from_entry
from voxroom.wire.protocol import MAX_TEXT_CHARS, ROOM_RATE, AudioFrame

log = logging.getLogger("voxroom.gateway.speech")

IDLE_TIMEOUT_S: Final = 30.0
"""No output from the room for this long: the utterance is given up (the worker died)."""
ABANDONED_TTL_S: Final = 300
SENDER: Final = "api"
WINDOW: Final = 4
"""Lines of one response waiting in its room at once (well under ``max_pending_per_room``)."""
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
    """At most ``limit`` responses at once. :meth:`reserve` takes a slot with no await between the
    check and the count, so a burst can never pass the limit."""

    limit: int
    active: int = 0
    peak: int = 0

    def reserve(self) -> bool:
        if self.active >= self.limit:
            return False
        self.active += 1
        self.peak = max(self.peak, self.active)
        STREAMS_OPEN.set(self.active)
        STREAMS_PEAK.set(self.peak)
        return True

    def release(self) -> None:
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
    commands_: list[tuple[Any, ...]] = ([("DEL", *names)] if finished else
                                        [("EXPIRE", name, ABANDONED_TTL_S) for name in names])
    try:
        await commands.group([*commands_, ("ZREM", index, room)])
    except (RedisError, OSError) as exc:
        log.warning("could not clean up private room %s: %s", room, exc)


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
    """Samples of every ``chunk`` entry read so far."""
    _line_at_ms: float = 0.0
    """Where the current line's audio begins in the response, and its ``start.pts_ms``."""
    _line_pts_ms: float = 0.0

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

    async def read(self) -> list[np.ndarray[Any, Any]]:
        """The next slices (empty once the last line's ``end`` was seen). Raises ``TimeoutError``,
        and what :meth:`top_up` raises."""
        if self.buffered:
            out, self.buffered = self.buffered, []
            return out
        deadline = time.monotonic() + IDLE_TIMEOUT_S
        while self.status is None:
            await self.top_up()
            got: Any = await self.commands.call("XRANGE", self.key, "(" + self.cursor, "+", "COUNT", 256)
            entries = [(entry_id, dict(zip(flat[::2], flat[1::2], strict=True))) for entry_id, flat in got or []]
            if not entries:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"no audio from room {self.room} in {IDLE_TIMEOUT_S:.0f} s")
                await self.watcher.wait(self.room, self.cursor, min(1.0, left))
                continue
            slices = []
            for entry_id, fields in entries:
                self.cursor = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
                kind = fields.get(b"kind")
                if kind == b"chunk":
                    frame = AudioFrame.decode(fields[b"frame"])
                    slices.append(np.frombuffer(frame.payload, dtype="<i2").astype(np.int16))
                    self.chunks += 1
                    self.samples += frame.samples
                elif self.keep_marks and kind in (b"start", b"marks"):
                    self._keep(fields)
                elif kind == b"end":
                    self.ended += 1
                    status = fields.get(b"status", b"ok").decode()
                    if status != "ok":
                        self.status, self.error = status, fields.get(b"error", b"").decode()
                        break
                    if self.ended >= len(self.lines):
                        self.status = "ok"
                        break
            if slices:
                return slices
            if time.monotonic() > deadline:
                raise TimeoutError(f"no audio from room {self.room} in {IDLE_TIMEOUT_S:.0f} s")
        return []

    def _keep(self, fields: dict[bytes, bytes]) -> None:
        try:
            msg = control_from_entry(fields)
        except ValueError as exc:  # a damaged entry costs its words, never the audio
            log.warning("speech room %s: %s", self.room, exc)
            return
        if msg is None:
            return
        if msg["type"] == "start":
            self._line_at_ms, self._line_pts_ms = self.samples * 1000 / ROOM_RATE, msg["pts_ms"]
        elif msg["type"] == "marks":
            shift = self._line_at_ms - self._line_pts_ms
            try:
                self.words += [HeardWord(self.ended, str(w["text"]), float(w["start_ms"]) + shift,
                                         float(w["end_ms"]) + shift, int(w["offset"]), int(w["length"]))
                               for w in msg["words"]]
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("speech room %s: malformed marks entry (%r)", self.room, exc)

    async def batches(self) -> AsyncIterator[list[np.ndarray[Any, Any]]]:
        """:meth:`read` until the last line ended (then :attr:`finished` is set). A failure ends
        the batches early, logged: the caller's response is already under way."""
        try:
            while slices := await self.read():
                yield slices
            self.finished = True
            if self.status != "ok":
                log.warning("speech room %s ended %s: %s", self.room, self.status, self.error)
        except TimeoutError as exc:
            log.warning("speech: %s; ending the response early", exc)
        except (RedisError, OSError, RoomBusy) as exc:
            log.warning("speech room %s: could not say its next line (%s); ending the response early",
                        self.room, exc)
