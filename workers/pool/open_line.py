"""An open line's feed: its pieces read from Redis as they come, cut into clauses, each spoken on
the line's context as soon as it is whole (docs/protocol.md, "Lines streamed in").

One task per open line, owned by the worker beside the line's publisher (workers/intake/worker.py).
It reads the line's pieces stream (``keys.open_line``) from its first entry, so a worker that
takes the line over after a crash speaks every piece received so far again, from the start (the
publisher's ``restart``), and goes on with the next. Between reads it waits on the room's output
stream through the worker's one stream watcher: every piece also appends a notice there
(voxroom/store/lua/lines.py), so nothing polls.

What it hands on, and to whom:

- each clause to :meth:`workers.pool.context.Context.speak_clause`, in order, one at a time: the
  line's slices are its clauses' audio, joined;
- each piece after the ``say``'s own text to the publisher (``Utterance.texts``), which tells the
  room (``text`` messages: the ``start`` carries the first piece);
- when the line's audio is about to run out while a long clause is still being written, its
  whole words so far, as a clause (:data:`LOW_WATER_S`): text that comes a little slower than
  speech is heard with a shorter pause, or none;
- each flush, once what the line held then is spoken, to the publisher (``Utterance.flush_acks``:
  it answers ``flushed`` to the sender when that audio is published).

The line ends when its sender closes it (``final``), when it was idle for ``idle_s`` (the feed
closes it in Redis, as if ``final``, unless a piece came meanwhile), when it is cancelled or cut
at the length bound (its ``cancel``), or when an engine fails it. Then the line's slices close and
the publisher sends the ``end``. Redis unavailable: the feed waits, as every loop does.
"""

from __future__ import annotations

import asyncio
import logging

from voxroom.store.backoff import REDIS_DOWN, Backoff
from voxroom.store.interface import JobBus
from voxroom.wire.protocol import SLICE_MS
from workers.engines.base import Engine
from workers.output.clock import RoomClock
from workers.pool.clause_split import ClauseSplitter, speakable
from workers.pool.context import Context
from workers.utterance import Utterance

log = logging.getLogger("voxroom.worker.open_line")

READ_COUNT = 64
"""Pieces read at a time (a line holds at most ``MAX_LINE_PARTS`` of them)."""
WAIT_MAX_S = 5.0
"""Longest single wait for a piece; the idle bound is checked at least this often."""
LOW_WATER_S = 0.6
"""When the line's audio not yet published falls below this while a clause is still being
written, its whole words so far are spoken at once: a clause cut early rather than a pause (a few
words take Piper about 0.1 s, espeak-ng less; the publisher's lead, 0.12 s, comes on top)."""


async def feed(bus: JobBus, ctx: Context, engine: Engine, utt: Utterance, *, idle_s: float,
               clock: RoomClock) -> None:
    """Speak ``utt``'s open line to its end (see the module docstring). Never raises for Redis:
    it waits; an unexpected failure fails the line. The line's slices are closed on every way out."""
    job = utt.job
    splitter = ClauseSplitter()
    cursor = "0-0"
    last_ms = clock.now_ms()
    closed = False
    flushes: list[int] = []
    backoff = Backoff()
    try:
        while not utt.cancel.is_set():
            try:
                tail = await bus.output_tail(job.room)  # before the read: a piece after it wakes the wait
                entries = await bus.read_pieces(job, cursor, READ_COUNT)
                backoff.reset()
            except REDIS_DOWN as exc:
                log.warning("room %s utterance %d: pieces not read, redis unavailable (%s)", job.room, job.seq, exc)
                await backoff.wait()
                continue
            for entry_id, fields in entries:
                cursor = entry_id
                last_ms = float(entry_id.split("-", 1)[0])
                text, offset, part = fields.get("text", ""), int(fields.get("offset", 0)), int(fields.get("part", 0))
                if text:
                    splitter.add(text, offset)
                    if part > 0:  # part 0 is the say's own text: the start carries it
                        utt.texts.append((offset, text))
                        utt.slices.notice()
                if fields.get("flush"):
                    flushes.append(part)
                if fields.get("final"):
                    closed = True
            if len(entries) == READ_COUNT:
                continue  # more are waiting: read them before speaking
            for offset, clause in splitter.take(everything=closed or bool(flushes)):
                if utt.cancel.is_set() or utt.error is not None:
                    break
                if speakable(clause):
                    await ctx.speak_clause(engine, utt, clause, offset)
            if utt.error is not None:
                return
            for part in flushes:
                utt.flush_acks.append((utt.slices.produced, part))
                utt.slices.notice()
            flushes.clear()
            if closed:
                return
            # Audio made and not yet published: how long the room has before it runs dry (the
            # publisher takes each slice ``lead`` before it plays, so this is what lies beyond it).
            ahead_s = utt.slices.pending() * SLICE_MS / 1000.0
            if utt.slices.produced and ahead_s < LOW_WATER_S:
                words = splitter.take_words()
                if words is not None:  # a long clause still being written: its words so far now
                    await ctx.speak_clause(engine, utt, words[1], words[0])
                    continue
            idle_left_s = idle_s - (clock.now_ms() - last_ms) / 1000.0
            wait_s = min(idle_left_s, WAIT_MAX_S)
            if utt.slices.produced and splitter.held:  # wake again when the audio runs low
                wait_s = min(wait_s, max(0.02, ahead_s - LOW_WATER_S))
            try:
                if idle_left_s <= 0:
                    if await bus.close_idle_line(job, cursor):
                        log.info("room %s utterance %d: no piece for %.0f s; closed", job.room, job.seq, idle_s)
                    continue  # closed, or a piece came: read it
                await bus.wait_output(job.room, tail, int(wait_s * 1000) + 1)
            except REDIS_DOWN as exc:
                log.warning("room %s utterance %d: redis unavailable while waiting for pieces (%s)", job.room,
                            job.seq, exc)
                await backoff.wait()
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        log.exception("room %s utterance %d: the open line's feed failed", job.room, job.seq)
        utt.error = f"{type(exc).__name__}: {exc}"
    finally:
        utt.slices.close()
