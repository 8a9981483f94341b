"""Publish one utterance into its room: wait for its turn, stamp presentation times, pace.

Utterances of a room may be synthesized in parallel by several contexts (or workers), but they
play in ``seq`` order: an utterance's audio is held (bounded, see ``workers/utterance.py``) until the
room's ``next`` says it is its turn. Then its slices are stamped on the room clock right after the
previous utterance's end (gapless), or ``lead_ms`` from now when the room was quiet, and published
``lead_ms`` ahead of their presentation time. The client's jitter buffer absorbs the lead. After
the first slice, paced slices go out :data:`PACED_GROUP` to an output entry when the engine is
ahead (voxroom/wire/output_entries.py): every hop pays once per group, and gateways still send one
frame per slice.

When the engine cannot keep up with real time (ChatTTS on a CPU), a slice would be published after
its presentation time; instead the rest of the utterance is moved later (a gap the client hears as
a pause, never as skipped audio).

Word marks (``workers/engines/marks.py``; times from the utterance's first sample) go out as a
``marks`` entry right before the slice that holds their start, put on the room clock by that
slice's presentation time: a late shift moves the words with the audio, and every client gets the
words before the audio they describe when the engine gives them in time (ChatTTS gives a piece's
words when the piece is done: slower than real time, they go out with the next slice, late).

Every write goes through a script that checks the job is still this worker's (``voxroom/store/jobs.py``):
when another worker took it over, :class:`voxroom.errors.OwnershipLost` ends the publishing at once
and nothing more of this take reaches the room. The same scripts check that the room's ``next``
is still this line's seq: when a later line skipped past it after its turn check,
:class:`voxroom.errors.TurnLost` ends it the same way, and the line is dropped as stale.

**A cancelled line** (a ``cancel``, issue 30; the room's ``:state`` lists it) is refused by the
same scripts (:class:`voxroom.errors.LineCancelled`). Playing, it is cut at the slice the refused
write began with: that one slice goes out with a fade to silence within :data:`CUT_FADE_MS` (no
click), then an ``end`` ``cancelled`` whose ``chunks`` is the cut point; the words of the refused
write never go out. Waiting for its turn, its synthesis stops at once (the ``cancel`` entry wakes
the wait) and in its turn it is passed: no ``start``, no ``end``, the next line right after.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, replace

import numpy as np

from voxroom.errors import LineCancelled, TurnLost
from voxroom.store.interface import JobBus, Turn
from voxroom.wire import protocol
from voxroom.wire.output_entries import EntryFields, entry_fields, flushed_fields, group_fields
from voxroom.wire.protocol import CODEC_OPUS, ROOM_RATE, SLICE_SAMPLES, AudioFrame, end_message, start_message
from workers.engines import marks as engine_marks
from workers.output.clock import RoomClock
from workers.output.opus import OpusEncoder
from workers.utterance import Utterance

log = logging.getLogger("voxroom.worker.publisher")
SLICE_MS = SLICE_SAMPLES * 1000.0 / ROOM_RATE
PACING_TICK_MS = 10.0
"""Paced slices leave up to this much after ``pts - lead`` (the lead, 120 ms, absorbs it)."""
UNPACED_BATCH = 64
"""Most slices in one pipelined XADD batch when publishing unpaced (about 400 kB with Opus)."""
CUT_FADE_MS = 10.0
"""A cancelled line's last slice fades to silence within this (issue 30: at most 10 ms)."""
PACED_GROUP = 2
"""Paced slices after an utterance's first travel this many to an output entry (see
``publish_utterance``): the second leaves 40 ms before its lead, 160 ms before it plays."""


@dataclass(slots=True)
class PublishResult:
    status: str  # "ok" | "failed" | "skipped" | "cancelled" (cut, or passed when nothing went out)
    chunks: int
    duration_ms: float
    first_slice_ms: float | None
    """Room-clock time the first slice was published (for time-to-first-audio metrics)."""
    late_shifts: int


class MarkClock:
    """An utterance's word marks on the room clock: each waits until the slice that holds its
    start is published, then takes that slice's presentation time plus its offset within it.
    Holds the presentation time of each slice published (at most ``MAX_UTTERANCE_SLICES``)."""

    __slots__ = ("_pts", "_waiting")

    def __init__(self) -> None:
        self._waiting: list[engine_marks.WordMark] = []
        self._pts: list[float] = []

    def slice_at(self, pts_ms: float) -> None:
        """The next slice goes out with this presentation time."""
        self._pts.append(pts_ms)

    def _room_ms(self, ms: float) -> float:
        k = min(int(ms // SLICE_MS), len(self._pts) - 1)
        return self._pts[k] + ms - k * SLICE_MS

    def due(self, new: Iterable[engine_marks.WordMark]) -> list[protocol.WordMark]:
        """The marks whose slice is out by now (with :meth:`slice_at`'s latest), on the room
        clock; the others keep waiting. A mark past the last slice at the end (a line cut short)
        never goes out."""
        self._waiting.extend(new)
        if not self._waiting or not self._pts:
            return []
        limit = len(self._pts) * SLICE_MS
        ready = [m for m in self._waiting if m.start_ms < limit]
        if not ready:
            return []
        self._waiting = [m for m in self._waiting if m.start_ms >= limit]
        out: list[protocol.WordMark] = []
        for m in sorted(ready, key=lambda m: m.start_ms):
            start = self._room_ms(max(0.0, m.start_ms))
            out.append({"text": m.text, "offset": m.offset, "length": m.length, "start_ms": start,
                        "end_ms": max(start, self._room_ms(m.end_ms))})
        return out


SKIP_STAGGER_MS = 1000.0
"""A line waiting for its turn skips past its predecessor this much later per line between them
(``wait_for_turn``): the line right behind a lost one skips first, the others then wait for it."""


async def wait_for_turn(bus: JobBus, utt: Utterance, clock: RoomClock,
                        timeout_ms: float) -> tuple[str, Turn]:
    """``("ok", turn)`` when it is this utterance's turn, ``("restart", turn)`` when it is and a
    dead worker had already begun publishing it, ``("stale", _)`` when the room already moved past
    it (it was skipped), or ``("timeout", _)`` after ``timeout_ms`` in which the room made no
    progress at all (no new output entry, no move of ``next``), after which the caller skips the
    predecessor. A line further back waits :data:`SKIP_STAGGER_MS` longer per line between it and
    ``next`` (at most ``timeout_ms`` more)."""
    room, seq = utt.job.room, utt.job.seq
    turn = await bus.room_turn(room)  # the common case, a quiet room: one round trip
    if turn.next == seq:
        return _in_turn(utt, turn), turn
    # The wait counts from the room's last progress, not from when this line began to wait. The
    # skip is for a predecessor nobody will ever publish (its job lost; a dead worker's job is
    # claimed and restarted instead), and such a room is silent. A room told lines faster than
    # real time holds more than ``timeout_ms`` of audio ahead of its later lines: counted from the
    # start of the wait, a line skipped past a predecessor still playing and their audio
    # interleaved. So every new entry in the output stream, and every move of ``next`` (a skip
    # writes no entry), starts the wait again.
    progress_ms = clock.now_ms()
    tail = await bus.output_tail(room)
    seen_next = turn.next
    while True:
        turn = await bus.room_turn(room)
        if seq in turn.cancelled:
            # Cancelled while it waits: no more synthesis. It still waits for its turn, to be
            # passed then (passing it now would move ``next`` past the line playing).
            utt.cancel.set()
        if turn.next == seq:
            return _in_turn(utt, turn), turn
        if turn.next > seq:
            return "stale", turn
        if turn.next != seen_next:
            seen_next, progress_ms = turn.next, clock.now_ms()
        # Lines waiting together behind a lost one run out of silence together: the one right
        # behind it skips first, and the move of ``next`` starts the others' wait again, instead of
        # a line further back skipping past a line that was only waiting too.
        behind = min((seq - turn.next - 1) * SKIP_STAGGER_MS, timeout_ms)
        remaining = progress_ms + timeout_ms + behind - clock.now_ms()
        if remaining <= 0:
            return "timeout", turn
        # Every change of ``next`` comes with an ``end`` entry in the output stream, so a blocked
        # read on the stream wakes us exactly when it is worth checking again. The tail was read
        # before the check above, so an ``end`` that lands in between still wakes us.
        got = await bus.wait_output(room, tail, int(min(remaining, 1000)))
        if got != tail:
            tail, progress_ms = got, clock.now_ms()


def _in_turn(utt: Utterance, turn: Turn) -> str:
    seq = utt.job.seq
    if seq in turn.cancelled:
        utt.cancel.set()
        return "cancelled"
    return "restart" if turn.started == seq else "ok"


def _echoes(utt: Utterance) -> list[EntryFields]:
    """An open line's pieces not yet told to the room, as ``text`` entries."""
    out: list[EntryFields] = []
    while utt.texts:
        offset, text = utt.texts.popleft()
        out.append(entry_fields({"type": "text", "utterance": utt.job.seq, "offset": offset, "text": text}))
    return out


def _acks(utt: Utterance, published: int | None) -> list[EntryFields]:
    """``flushed`` answers whose audio is out (``published`` slices; ``None``: all of them)."""
    out: list[EntryFields] = []
    while utt.flush_acks and (published is None or utt.flush_acks[0][0] <= published):
        _, part = utt.flush_acks.popleft()
        out.append(flushed_fields(utt.job.seq, {"type": "flushed", "seq": utt.job.open_seq, "part": part},
                                  utt.job.sender))
    return out


async def _next_of_open_line(utt: Utterance, published: int,
                             send: Callable[[list[EntryFields], int | None], Awaitable[None]]) -> np.ndarray | None:
    """An open line's next slice; meanwhile, what its feed has to tell the room goes out at once
    (a piece of text while its clause waits for more, a flush answered with no new audio). Only
    once the line's ``start`` is out: nothing of a line may come before it."""
    while True:
        got = await utt.slices.get_or_notice()
        if not isinstance(got, str):
            return got
        if published:
            notices = _echoes(utt) + _acks(utt, published)
            if notices:
                await send(notices, None)


def fade_out(pcm: np.ndarray, fade_ms: float = CUT_FADE_MS) -> np.ndarray:
    """``pcm`` (one int16 slice) faded to silence within ``fade_ms`` from its first sample (a
    raised-cosine ramp), silence after: the slice a cancelled line ends on."""
    n = min(pcm.size, max(1, int(ROOM_RATE * fade_ms / 1000)))
    ramp = 0.5 * (1.0 + np.cos(np.linspace(0.0, np.pi, n, dtype=np.float32)))
    out = np.zeros(pcm.size, dtype=np.int16)
    out[:n] = np.round(pcm[:n].astype(np.float32) * ramp).astype(np.int16)
    return out


async def publish_utterance(bus: JobBus, utt: Utterance, clock: RoomClock, *, lead_ms: float,
                            order_wait_ms: float, voice_name: str, opus_bitrate: int = 0,
                            paced: bool = True) -> PublishResult:
    """``opus_bitrate`` > 0: every chunk entry also carries ``opus``, the same frame Opus-encoded
    (workers/output/opus.py), so that gateways pick a codec per client without encoding anything: one
    encoding per room, whatever the number of gateways and listeners.

    ``paced=False`` (private API rooms, which nobody plays in real time): slices go out as soon as
    they exist, in batches of at most :data:`UNPACED_BATCH`; order and framing are unchanged.

    ``status == "skipped"``: the room moved past the line (before it began, or, refused by Redis,
    while it played); the caller acks its job. Raises :class:`voxroom.errors.OwnershipLost` when
    the job is another worker's."""
    try:
        return await _publish_utterance(bus, utt, clock, lead_ms=lead_ms, order_wait_ms=order_wait_ms,
                                        voice_name=voice_name, opus_bitrate=opus_bitrate, paced=paced)
    except TurnLost:
        # Passed its turn check, then a later line skipped past it (it was silent longer than that
        # line's wait): Redis refused the write, and everything after it, atomically. Whatever of
        # it went out before stays; the rest would have interleaved with the line now playing.
        utt.cancel.set()
        log.warning("room %s utterance %d: a later line skipped past it while it was to play; dropped as "
                    "stale", utt.job.room, utt.job.seq)
        return PublishResult("skipped", 0, 0.0, None, 0)


async def _publish_utterance(bus: JobBus, utt: Utterance, clock: RoomClock, *, lead_ms: float,
                             order_wait_ms: float, voice_name: str, opus_bitrate: int,
                             paced: bool) -> PublishResult:
    job = utt.job
    turn, state = await wait_for_turn(bus, utt, clock, order_wait_ms)
    if turn == "timeout":
        log.warning("room %s utterance %d: no progress in the room for %.0f ms while it waited for its "
                    "predecessor; skipping past it", job.room, job.seq, order_wait_ms)
        await bus.skip_to(job)  # never moves ``next`` back
        state = await bus.room_turn(job.room)
        if state.next != job.seq:
            # A line further back skipped past this one too in the meantime: publishing now would
            # interleave with it.
            turn = "stale"
    if turn == "stale":
        utt.cancel.set()
        log.warning("room %s utterance %d arrived after the room moved on; dropped", job.room, job.seq)
        return PublishResult("skipped", 0, 0.0, None, 0)
    if turn == "cancelled":
        if state.started == job.seq:
            # Begun by a worker that died: the room has some of it. Not restarted; ended where
            # that worker's slices stop.
            chunks = await bus.published_slices(job.room, job.seq)
            return await _end_cut(bus, utt, chunks, max(state.end_ms, clock.now_ms()))
        await bus.pass_turn(job)
        log.info("room %s utterance %d cancelled before it began; passed", job.room, job.seq)
        return PublishResult("cancelled", 0, 0.0, None, 0)
    try:
        return await _publish_in_turn(bus, utt, clock, state, turn, lead_ms=lead_ms, opus_bitrate=opus_bitrate,
                                      paced=paced, voice_name=voice_name)
    except _Cut as cut:
        return await _cut(bus, utt, cut)


@dataclass
class _Cut(Exception):
    """A write refused because the line was cancelled: where the refused write began."""
    chunk: int
    """The first slice the refused write held (0: nothing of the line went out)."""
    pts_ms: float
    pcm: np.ndarray | None
    """That slice's samples (``None``: the refused write held no slice)."""
    encoder: OpusEncoder | None


async def _cut(bus: JobBus, utt: Utterance, cut: _Cut) -> PublishResult:
    """End a cancelled line at ``cut``: its slice faded to silence, then ``end`` ``cancelled``; or
    pass its turn when nothing of it went out."""
    job = utt.job
    utt.cancel.set()
    if cut.chunk == 0:
        await bus.pass_turn(job)
        log.info("room %s utterance %d cancelled before its first slice; passed", job.room, job.seq)
        return PublishResult("cancelled", 0, 0.0, None, 0)
    chunks, end_ms = cut.chunk, cut.pts_ms
    if cut.pcm is not None:
        faded = fade_out(cut.pcm)
        frame = AudioFrame(room=job.room, seq=job.seq, chunk=cut.chunk, pts_us=int(cut.pts_ms * 1000),
                           sample_rate=ROOM_RATE, samples=int(faded.size), payload=faded.tobytes(),
                           first=False, last=True)
        opus = None
        if cut.encoder is not None:
            opus = [replace(frame, codec=CODEC_OPUS, payload=cut.encoder.encode(faded) + cut.encoder.flush()).encode()]
        await bus.publish(job, [group_fields(job.seq, cut.chunk, [frame.encode()], opus)], final=True)
        chunks, end_ms = cut.chunk + 1, cut.pts_ms + SLICE_MS
    return await _end_cut(bus, utt, chunks, end_ms)


async def _end_cut(bus: JobBus, utt: Utterance, chunks: int, end_ms: float) -> PublishResult:
    job = utt.job
    utt.cancel.set()
    end = end_message(job.seq, chunks=chunks, duration_ms=chunks * SLICE_MS, cancelled=True)
    await bus.finish(job, entry_fields(end, room_end_ms=end_ms), end_ms, cut=True)
    log.info("room %s utterance %d cancelled: cut after %d slices", job.room, job.seq, chunks)
    return PublishResult("cancelled", chunks, chunks * SLICE_MS, None, 0)


async def _publish_in_turn(bus: JobBus, utt: Utterance, clock: RoomClock, state: Turn, turn: str, *,
                           lead_ms: float, opus_bitrate: int, paced: bool, voice_name: str) -> PublishResult:
    job = utt.job
    end_ms = state.end_ms

    # Stamp the start once the first slice exists: stamping earlier would put a slow engine's
    # first slice in the past and force a shift on every utterance.
    first = await utt.slices.get()
    next_pts = max(clock.now_ms() + lead_ms, end_ms)
    chunk = 0
    shifts = 0
    first_ms: float | None = None
    # The start entry travels with the first slice: one round trip, and clients never see a start
    # whose audio is not already on its way.
    # A restart: a worker died mid-utterance and we took it over. The clients drop what they got
    # of the first take when they see chunk 0 again (and this flag), so nothing plays twice.
    start = start_message(job.seq, sender=job.sender, voice=voice_name, text=job.text, pts_ms=next_pts,
                          restart=turn == "restart", private=bool(job.to))
    pending: list[EntryFields] = [entry_fields(start)]
    if turn == "restart":
        log.warning("room %s utterance %d restarted from its first slice", job.room, job.seq)
    mark_started: int | None = job.seq
    item = first
    # Opus copies only for rooms where some gateway has an Opus listener (encoding costs about
    # 0.3 ms a slice on this loop); a listener who joins mid-utterance gets PCM until the next one.
    wanted = opus_bitrate > 0 and state.opus_wanted and first is not None
    encoder = OpusEncoder(bitrate=opus_bitrate) if wanted else None
    words = MarkClock()
    frames: list[bytes] = []
    opus_frames: list[bytes] = []
    """The slices of the group being built (one ``chunk`` entry), and their Opus copies."""
    unsent: _Cut | None = None
    """The first slice of what waits in ``pending``: where a cancel cuts the line."""

    async def send(entries: list[EntryFields], started: int | None) -> None:
        try:
            await bus.publish(job, entries, started=started)
        except LineCancelled:
            raise (unsent or _Cut(chunk, next_pts, None, encoder)) from None

    while item is not None:
        if paced and next_pts < clock.now_ms() + SLICE_MS / 2:
            # The engine fell behind real time: move the rest later rather than publish it late.
            next_pts = clock.now_ms() + lead_ms
            shifts += 1
        if paced and not frames:
            # Rounded to a shared tick: rooms' slices due together leave in one pipeline.
            await clock.sleep_until(next_pts - lead_ms, tick_ms=PACING_TICK_MS)
        words.slice_at(next_pts)
        if utt.texts:  # an open line's new pieces, ahead of their audio (captions)
            pending += _echoes(utt)
        heard = words.due(utt.slices.take_marks())
        if heard:  # ahead of the group that holds the slice: words never come after their audio
            pending.append(entry_fields(protocol.marks_message(job.seq, heard)))
        frame = AudioFrame(room=job.room, seq=job.seq, chunk=chunk, pts_us=int(next_pts * 1000),
                           sample_rate=ROOM_RATE, samples=int(item.size), payload=item.tobytes(),
                           first=chunk == 0, last=utt.slices.next_is_end())
        if unsent is None:
            unsent = _Cut(chunk, next_pts, item, encoder)
        frames.append(frame.encode())
        if encoder is not None:
            payload = encoder.encode(item) + (encoder.flush() if frame.last else b"")
            opus_frames.append(replace(frame, codec=CODEC_OPUS, payload=payload).encode())
        chunk += 1
        next_pts += SLICE_MS
        if paced and chunk > 1 and len(frames) < PACED_GROUP and utt.slices.has_next():
            # Paced slices after the first travel in groups: the group leaves when its first
            # slice is due, the next ones that much earlier than the lead (the client's buffer
            # plays by presentation time). Every hop then pays once per group, not per slice.
            item = await utt.slices.get()
            continue
        pending.append(group_fields(job.seq, chunk - len(frames), frames, opus_frames if encoder else None))
        frames, opus_frames = [], []
        if utt.flush_acks:  # in the same write as the audio they wait for
            pending += _acks(utt, chunk)
        # Slices that are already due go out in one round trip; otherwise publish this one now.
        # Unpaced, the first slice still goes out alone: it is what the caller waits for.
        due = next_pts - lead_ms <= clock.now_ms() if paced else 1 < chunk and len(pending) < UNPACED_BATCH
        if not (utt.slices.has_next() and due):
            await send(pending, mark_started)
            pending, mark_started, unsent = [], None, None
            if first_ms is None:
                first_ms = clock.now_ms()
        item = await utt.slices.get() if not job.open_seq else await _next_of_open_line(utt, chunk, send)
    late = words.due(utt.slices.take_marks())  # an estimate given after its audio
    if late:
        pending.append(entry_fields(protocol.marks_message(job.seq, late)))
    pending += _echoes(utt) + _acks(utt, None)  # an open line's last pieces and flushes
    if pending:  # also the start entry of an utterance that produced no audio at all
        await send(pending, mark_started)
        first_ms = first_ms if first_ms is not None else clock.now_ms()
    duration = chunk * SLICE_MS
    end = end_message(job.seq, chunks=chunk, duration_ms=duration, error=utt.error)
    try:
        await bus.finish(job, entry_fields(end, room_end_ms=next_pts), next_pts)
    except LineCancelled:
        # Cancelled after its last slice went out: every slice plays, and the end says cancelled.
        return await _end_cut(bus, utt, chunk, next_pts)
    return PublishResult(end["status"], chunk, duration, first_ms, shifts)

