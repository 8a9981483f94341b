"""Closed-loop streaming load: N rooms speaking continuously through one real context (issue #14).

    .venv/bin/python bench/streaming_load.py [--engine chattts|synthetic] [--size full|tiny]
        [--gpt bf16] [--threads 2] [--device cpu] [--rooms 1,2,4,8,16] [--seconds 20]
        [--piece-seconds 2] [--max-batch 8] [--modes windowed,continuous] [--yield-ahead-s 2]

Modelled on Riva's perf client (``--streaming``, N concurrent streams, each sending its next request
when the previous response is complete) and on the continuity metrics vLLM-Omni and SGLang-Omni
report for streaming speech. Every room is one stream: it puts a line into the context's queue, takes
that line's 40 ms slices as the context hands them out, and **puts its next line as soon as the
previous one has been fully produced** (its last slice is out), not after its audio has played. Why:
the engine then holds exactly N lines at every moment, so N is the load it is measured at (a room
that waited for playout would leave its row idle for as long as the engine ran ahead of real time,
and the load would depend on the engine's speed); and it is the heaviest load N rooms can make, the
one of a room whose text comes faster than speech (an LLM writing, a narrator's queue). Audio that
comes faster than real time is what a client would buffer; per-line continuity is measured against
real-time playout from each line's first slice.

Lines are one or two sentences of ``chattts_common.TEXTS`` (drawn per room from a seeded generator):
ChatTTS speaks each sentence as one piece of ``--piece-seconds`` (random weights never meet EOS, so
the length is forced), so lines are 2 or 4 s by default and rows leave the batch at different times,
as real lines do. The synthetic engine's lines last as long as their text (about 5 or 10 s).

Per mode (windowed batches, the default, and ``continuous``: rows join at the next step; the same
loaded model, the same process) and per N, each cell runs ``--seconds`` of wall time: lines are
started until then, the lines in flight then finish (cut after ``--drain-s``), and:

- **first audio** p50/p95/p99: a line's entry in the context's queue to its first slice out;
- **worst gap** per line against real-time playout: playback starts at the first slice with no
  buffer, each slice plays 40 ms; a slice that arrives after the previous one's playout ended leaves
  that much silence (the playout then resumes from the late slice). C50/C100/C200: share of lines
  whose worst gap is under 50/100/200 ms;
- **between lines** p50/max: the silence between a room's consecutive lines (the next line's
  first slice after the previous line's playout ended, no buffer);
- **underruns** with a 3-slice jitter buffer: the client starts once 3 slices (or the whole line)
  are in, and when a slice is not there when due, counts one underrun and buffers 3 again;
- **audio s / wall s**: seconds of audio that came out during the ``--seconds`` window, over it;
- **engine busy**: share of the window the engine had work (a windowed batch running; a continuous
  engine not waiting in ``admit(None)`` for a line); on the synthetic engine its sleeps stand for a
  GPU's compute and count as busy;
- **CPU cores**: this process's CPU seconds per wall second over the window and the drain (2.0 is
  both cores of the machine the numbers in docs/benchmarks.md come from).

Only lines that ended normally count in the per-line columns; ``cut`` counts lines the drain limit
cut. Below the table: per mode, the largest N with C100 = 100 % (the rooms one context holds), and
for continuous ChatTTS how often a line far ahead of its playout gave its row to a waiting line at a
piece boundary (``continuous.YIELD_AHEAD_S``: only when lines wait for rows and run ahead of real
time, so on a GPU).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import threading
import time
from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import chattts_common as common
import numpy as np

SLICE_S = 0.040
PREBUFFER = 3
C_LIMITS_MS = (50, 100, 200)


class Metered:
    """The engine as the context sees it, with the time it had work recorded. Attributes the
    context reads (``name``, ``max_batch``, ``continuous``, ``sample_rate``) pass through;
    ``close`` does not: one loaded engine serves every cell."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.spans: list[tuple[float, float]] = []
        self._open: float | None = None
        self.finished = threading.Event()
        """Set when a ``stream_continuous`` call has returned (its thread is done)."""

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def _start(self) -> None:
        if self._open is None:
            self._open = time.perf_counter()

    def _end(self) -> None:
        if self._open is not None:
            self.spans.append((self._open, time.perf_counter()))
            self._open = None

    def busy_s(self, t0: float, t1: float) -> float:
        spans = list(self.spans)
        if self._open is not None:
            spans.append((self._open, t1))
        return sum(max(0.0, min(b, t1) - max(a, t0)) for a, b in spans)

    def _timed(self, chunks: Iterable[Any]) -> Iterator[Any]:
        self._start()
        try:
            yield from chunks
        finally:
            self._end()

    def stream(self, request: Any, cancel: threading.Event) -> Iterator[Any]:
        return self._timed(self._inner.stream(request, cancel))

    def stream_batch(self, requests: Any, cancel: Any) -> Iterator[Any]:
        return self._timed(self._inner.stream_batch(requests, cancel))

    @property
    def stream_timed(self) -> Callable[[Any, threading.Event], Iterator[Any]]:
        # A line alone goes through ``stream_timed`` where the engine has one (workers/pool/batching.py
        # looks for it with getattr), so it is timed like the others; an engine without it raises
        # AttributeError here and in __getattr__ alike.
        timed = self._inner.stream_timed
        return lambda request, cancel: self._timed(timed(request, cancel))

    def stream_continuous(self, admit: Callable[[float | None], Any]) -> Iterator[tuple[Hashable, Any]]:
        def metered(timeout: float | None) -> Any:
            if timeout is not None:
                return admit(timeout)
            self._end()  # nothing runs: the engine waits for a line
            try:
                return admit(None)
            finally:
                self._start()

        self.finished.clear()
        self._start()
        try:
            yield from self._inner.stream_continuous(metered)
        finally:
            self._end()
            self.finished.set()

    def close(self) -> None:
        pass


@dataclass
class Line:
    room: int
    sent: float
    arrivals: list[float]
    ended: bool
    """Every slice came and the line was neither cut nor failed."""


def playout(arrivals: list[float]) -> tuple[float, float]:
    """(longest silence, end of playout) with no buffer: playout starts at the first slice, a late
    slice resumes it."""
    worst, play_end = 0.0, arrivals[0] + SLICE_S
    for a in arrivals[1:]:
        worst = max(worst, a - play_end)
        play_end = max(play_end, a) + SLICE_S
    return worst, play_end


def worst_gap_s(arrivals: list[float]) -> float:
    return playout(arrivals)[0]


def between_lines_s(lines: list[Line]) -> list[float]:
    """Silence between a room's consecutive lines: the next line's first slice after the previous
    line's playout ended. It shows what per-line figures cannot: a windowed context closes a line
    (hands its last slice over) only when its whole batch ends, so the room's next line starts late
    while its own first-audio time looks short."""
    gaps: list[float] = []
    by_room: dict[int, list[Line]] = {}
    for line in lines:
        if line.arrivals:
            by_room.setdefault(line.room, []).append(line)
    for mine in by_room.values():
        mine.sort(key=lambda line: line.sent)
        gaps += [max(0.0, b.arrivals[0] - playout(a.arrivals)[1]) for a, b in itertools.pairwise(mine)]
    return gaps


def underruns(arrivals: list[float], prebuffer: int = PREBUFFER) -> int:
    """Underruns of a client that buffers ``prebuffer`` slices before playing, and again after each."""
    n, count = len(arrivals), 0
    clock = arrivals[min(prebuffer, n) - 1]
    for i, a in enumerate(arrivals):
        if a > clock:
            count += 1
            clock = arrivals[min(i + prebuffer, n) - 1]
        clock += SLICE_S
    return count


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


async def cell(engine: Metered, continuous: bool, rooms: int, seconds: float, drain_s: float,
               texts: list[list[str]], seed: int) -> tuple[list[Line], float, float, float]:
    """One mode at one N: the lines, the audio seconds and engine busy seconds in the window, and the
    CPU cores this process kept busy (window and drain)."""
    from voxroom.voices.catalog import Catalog, Voice
    from voxroom.wire.jobs import Job
    from workers.pool.context import Context
    from workers.utterance import SliceBuffer, Utterance

    engine._inner.continuous = continuous
    voices = [Voice(id=f"bench-{i}", engine=engine.name, language="eng", params={"seed": 100 + i})
              for i in range(rooms)]
    ctx = Context("bench#0", str(getattr(engine, "device", "cpu")), {engine.name: engine},
                  Catalog(voices, voices[0].id), queue_size=max(4, rooms))
    runner = asyncio.create_task(ctx.run(lambda utt: None), name="bench:context")
    loop = asyncio.get_running_loop()
    lines: list[Line] = []
    in_flight: dict[int, Utterance] = {}  # by identity: utterances are not hashable
    t0 = time.perf_counter()
    c0 = time.process_time()
    stop_at = t0 + seconds

    async def room(i: int) -> None:
        rng = random.Random(seed * 1_000 + i)
        seq = 0
        while seq == 0 or time.perf_counter() < stop_at:  # at least one line (the warm-up runs one)
            seq += 1
            text = " ".join(texts[i % len(texts)][:rng.choice((1, 2))])
            job = Job(entry_id=f"{i}-{seq}", room=f"room-{i}", seq=seq, text=text, voice=voices[i].id,
                      prev_voice=voices[i].id, sender="bench", time_ms=time.time() * 1000)
            utt = Utterance(job=job, slices=SliceBuffer(loop))
            in_flight[id(utt)] = utt
            sent = time.perf_counter()
            await ctx.queue.put(utt)
            arrivals: list[float] = []
            while await utt.slices.get() is not None:
                arrivals.append(time.perf_counter())
            del in_flight[id(utt)]
            ctx.release(utt)
            ended = bool(arrivals) and utt.error is None and not utt.cancel.is_set()
            lines.append(Line(i, sent, arrivals, ended))

    async def cut_after_drain() -> None:
        await asyncio.sleep(seconds + drain_s)
        for utt in list(in_flight.values()):
            utt.cancel.set()

    try:
        drain = asyncio.create_task(cut_after_drain(), name="bench:drain")
        await asyncio.gather(*(room(i) for i in range(rooms)))
        drain.cancel()
        t1 = min(time.perf_counter(), stop_at)
        cores = (time.process_time() - c0) / (time.perf_counter() - t0)  # over the window and the drain
        audio = sum(1 for line in lines for a in line.arrivals if a <= stop_at) * SLICE_S
        return lines, audio, engine.busy_s(t0, t1), cores
    finally:
        runner.cancel()
        ctx.close()
        if continuous:  # its thread ends once it reads the close: the next cell starts a fresh one
            await asyncio.to_thread(engine.finished.wait, 30.0)


def summary(mode: str, rooms: int, seconds: float, lines: list[Line], audio: float, busy: float,
            cpu: float) -> tuple[list[object], float]:
    done = [line for line in lines if line.ended]
    ttfa = [(line.arrivals[0] - line.sent) * 1000 for line in done]
    gaps = [worst_gap_s(line.arrivals) * 1000 for line in done]
    under = sum(underruns(line.arrivals) for line in done)
    between = [g * 1000 for g in between_lines_s(lines)]
    share = [100.0 * sum(g < limit for g in gaps) / len(gaps) if gaps else float("nan") for limit in C_LIMITS_MS]
    row: list[object] = [mode, rooms, len(done), len(lines) - len(done),
                         f"{pct(ttfa, 50):.0f}", f"{pct(ttfa, 95):.0f}", f"{pct(ttfa, 99):.0f}",
                         f"{pct(gaps, 50):.0f}", f"{max(gaps, default=float('nan')):.0f}", under,
                         f"{pct(between, 50):.0f}", f"{max(between, default=float('nan')):.0f}",
                         *(f"{s:.0f} %" for s in share), f"{audio / seconds:.2f}",
                         f"{100 * busy / seconds:.0f} %", f"{cpu:.2f}"]
    return row, share[1] if len(lines) == len(done) else 0.0


HEADER = ["mode", "N", "lines", "cut", "first audio p50 (ms)", "p95", "p99", "worst gap p50 (ms)",
          "worst gap max", "underruns (3-slice buffer)", "between lines p50 (ms)", "between lines max",
          "C50", "C100", "C200", "audio s / wall s", "engine busy", "CPU cores"]


def build_engine(args: argparse.Namespace) -> Any:
    if args.engine == "synthetic":
        from workers.engines.synthetic import SyntheticEngine

        return SyntheticEngine(ttfc_ms=args.synthetic_ttfc_ms, rtf=args.synthetic_rtf, max_batch=args.max_batch)
    import torch

    torch.set_num_threads(args.threads)
    steps = round(args.piece_seconds * common.STEPS_PER_SECOND)
    return common.engine(args.size, args.device, int8=args.gpt == "int8", bf16=args.gpt == "bf16", steps=steps,
                         max_batch=args.max_batch)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--engine", default="chattts", choices=["chattts", "synthetic"])
    ap.add_argument("--size", default="full", choices=["full", "tiny"])
    ap.add_argument("--gpt", default="bf16", choices=["fp32", "bf16", "int8"])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--rooms", default="1,2,4,8,16", help="comma-separated N")
    ap.add_argument("--seconds", type=float, default=20.0, help="wall time per mode and N")
    ap.add_argument("--drain-s", type=float, default=60.0, help="lines still running this long after "
                    "--seconds are cut")
    ap.add_argument("--piece-seconds", type=float, default=2.0, help="ChatTTS: audio per sentence")
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--modes", default="windowed,continuous")
    ap.add_argument("--yield-ahead-s", type=float, default=None, help="ChatTTS continuous: a line this far "
                    "ahead of its playout yields its row at a piece boundary (default: the engine's, 2 s; "
                    "inf: never)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--synthetic-rtf", type=float, default=0.2)
    ap.add_argument("--synthetic-ttfc-ms", type=float, default=50.0)
    args = ap.parse_args()
    common.quiet()
    rooms = [int(n) for n in args.rooms.split(",")]
    modes = args.modes.split(",")
    texts = [[common.TEXTS[(i + k) % len(common.TEXTS)] for k in range(2)] for i in range(len(common.TEXTS))]
    engine = Metered(build_engine(args))
    if args.yield_ahead_s is not None:
        engine._inner.yield_ahead_s = args.yield_ahead_s
    for mode in modes:  # warm-up: one line each (numba normalizer, allocator, first prefill)
        asyncio.run(cell(engine, mode == "continuous", 1, 0.0, args.drain_s, texts, args.seed))
    rows, holds = [], {mode: 0 for mode in modes}
    yields: dict[int, int] = {}
    started = time.perf_counter()
    for n in rooms:
        for mode in modes:
            lines, audio, busy, cpu = asyncio.run(cell(engine, mode == "continuous", n, args.seconds, args.drain_s,
                                                       texts, args.seed))
            batcher = getattr(engine._inner, "batcher", None)  # ChatTTS's, of the cell just run
            if mode == "continuous" and batcher is not None:
                yields[n] = batcher.yields
            row, c100 = summary(mode, n, args.seconds, lines, audio, busy, cpu)
            if c100 == 100.0:
                holds[mode] = max(holds[mode], n)
            rows.append(row)
            print("# " + " | ".join(str(c) for c in row), flush=True)
    engine._inner.close()
    gpt = "fp16 (CUDA)" if args.device.startswith("cuda") else args.gpt  # the engine's CUDA default
    what = (f"synthetic rtf={args.synthetic_rtf:g} first chunk {args.synthetic_ttfc_ms:g} ms" if args.engine ==
            "synthetic" else f"chattts size={args.size} gpt={gpt} threads={args.threads} "
            f"piece={args.piece_seconds:g} s")
    print(f"\n{what} device={args.device} max_batch={args.max_batch} rooms={args.rooms} "
          f"seconds={args.seconds:g} per cell, {time.perf_counter() - started:.0f} s in all\n")
    print(common.table(HEADER, rows))
    print()
    for mode in modes:
        print(f"{mode}: largest N with C100 = 100 % and no line cut: {holds[mode] or 'none'} "
              f"(of {args.rooms})")
    if yields:  # lines far ahead of their playout that let a waiting line take their row first
        print("continuous: rows yielded at a piece boundary (YIELD_AHEAD_S), by N: "
              + ", ".join(f"{n}: {k}" for n, k in yields.items()))


if __name__ == "__main__":
    main()
