"""One row's audio on its way from an engine to its utterance's slices, and the row's end.

Every synthesis path (a windowed batch, a continuous engine's row, a row whose engine failed)
feeds and finishes its rows here, so the length cut, the end-of-utterance flush and the count of
audio made are written once.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

import numpy as np

from workers.audio_cache.cache import CachedLine
from workers.engines.marks import WordMark
from workers.output.slicer import Slice, Slicer
from workers.utterance import Utterance

log = logging.getLogger("voxroom.worker.context")


class Meter(Protocol):
    """A context's real-time-factor figures (the heartbeat's ``ctx.*.rtf``). ``audio_seconds``
    counts every row's audio (:meth:`Row.finish`); ``synth_seconds`` only windowed batches'
    wall time: continuous rows overlap, so per-row wall time would overstate it."""

    synth_seconds: float
    audio_seconds: float


class Row:
    """One utterance being synthesized: its slicer, the slices kept for the audio cache (``keep``)
    and the clock its first chunk is timed from (``started``: a batch's rows share one). Owned by
    the one thread that runs its engine."""

    __slots__ = ("kept", "kept_marks", "max_slices", "slicer", "started", "utt")

    def __init__(self, utt: Utterance, engine_rate: int, *, max_slices: int, keep: bool,
                 started: float | None = None) -> None:
        self.utt = utt
        self.slicer = Slicer(engine_rate)
        self.kept: list[Slice] | None = [] if keep else None
        self.kept_marks: list[WordMark] = []
        self.started = time.perf_counter() if started is None else started
        self.max_slices = max_slices
        utt.synth_started_ms = time.time() * 1000.0

    def feed(self, pcm: object) -> None:
        """An engine chunk: slice it into the utterance, cut the line at ``max_slices``."""
        utt = self.utt
        if utt.cancel.is_set():
            return
        if utt.source != "engine" and not utt.claim("engine"):
            return  # the audio cache serves this line (the row is being cancelled)
        if utt.engine_first_chunk_ms is None:
            utt.engine_first_chunk_ms = (time.perf_counter() - self.started) * 1000.0
        pieces = self.slicer.push(pcm)  # type: ignore[arg-type]
        room_left = self.max_slices - 1 - utt.slices.produced
        if len(pieces) > room_left:
            # Too long (a runaway engine or a hostile line): end here, faded so the cut does not
            # click, and stop the engine (the cancel flag is what every engine stops a row by).
            pieces = pieces[:max(0, room_left) + 1]
            fade = np.linspace(1.0, 0.0, pieces[-1].size, dtype=np.float32)
            pieces[-1] = (pieces[-1].astype(np.float32) * fade).astype(np.int16)
            utt.slices.extend(pieces)
            utt.cancel.set()
            log.warning("room %s utterance %d cut at %d slices", utt.job.room, utt.job.seq, self.max_slices)
            return
        # One hand-over per engine chunk, not per slice (see SliceBuffer).
        utt.slices.extend(pieces)
        if self.kept is not None:
            self.kept += pieces

    def mark(self, marks: list[WordMark]) -> None:
        """Word marks from a timed engine (``TimedEngine.stream_timed``): on to the publisher,
        which puts each on the room clock by the slice that holds it, and kept for the cache.
        Like audio, they make the engine the line's source (whichever has output first)."""
        utt = self.utt
        if not marks or utt.cancel.is_set():
            return
        if utt.source != "engine" and not utt.claim("engine"):
            return
        utt.slices.add_marks(marks)
        if self.kept is not None:
            self.kept_marks += marks

    def fail(self, reason: str) -> None:
        """The engine failed this row (call :meth:`finish` next). A line the audio cache took
        over is not failed by the engine."""
        if self.utt.claim("engine"):
            self.utt.error = reason

    def finish(self, meter: Meter) -> CachedLine | None:
        """End the row, once, whatever path it took: the last slice (unless the line was
        cancelled, cut or failed), the utterance's slices closed, its audio counted. Returns the
        line's PCM and marks for the audio cache when it was kept and is the whole line, else
        ``None``."""
        utt = self.utt
        if not utt.claim("engine"):
            return None  # the audio cache served this line; its slices are closed already
        whole = not utt.cancel.is_set() and utt.error is None
        if whole:
            tail = self.slicer.flush()
            utt.slices.extend(tail)
            if self.kept is not None:
                self.kept += tail
        utt.slices.close()
        meter.audio_seconds += self.slicer.total_samples / self.slicer.out_rate
        if not whole or not self.kept:
            return None
        # Joined here, on the engine's thread: never on the event loop.
        return CachedLine(b"".join(piece.tobytes() for piece in self.kept), tuple(self.kept_marks))
