"""ChatTTS's continuous batcher behind a context that bounds its intake (issue 14): the real
ChatTTS modules on the tiny checkpoint, a real ``ContextPool`` context (its queue schedules by
rooms in turn and by the audio each room has buffered). The engine is handed at most
``max_batch`` plus ``SPARE_ROWS`` lines not yet finished, so a room that floods its queue no
longer fills the batcher's FIFO ahead of the rooms that speak after it. Counted in GPT passes and
in the order of what happened, never in milliseconds."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.chattts.conftest import VOICES, make_engine
from tests.support import waiting
from voxroom.voices.catalog import Catalog
from voxroom.wire.jobs import Job
from workers.pool import continuous_rows as rows
from workers.pool.pool import ContextPool
from workers.utterance import SliceBuffer, Utterance

until = functools.partial(waiting.until, timeout=120.0, every=0.02)

pytestmark = pytest.mark.chattts

MAX_BATCH = 2
CAP = MAX_BATCH + rows.SPARE_ROWS
STEPS = 60  # a line: 60 GPT steps, 1.28 s of audio (its first chunk after 16)


class Recorder:
    """What happened to each line in the engine (``handed``, ``first``, ``done``), in order, and
    the most lines the batcher held (in rows and waiting) at any GPT pass."""

    def __init__(self, engine: Any) -> None:
        self.events: list[tuple[str, str]] = []
        self.most_rows = 0
        self.most_in_batcher = 0
        self.held: Callable[[], int] = lambda: 0
        """Lines the context counts as handed and not finished (set once the context exists)."""
        self.most_held = 0
        inner = engine.stream_continuous

        def stream_continuous(admit: Callable[[float | None], Any]) -> Iterator[tuple[Hashable, Any]]:
            names: dict[Hashable, str] = {}

            def noting(timeout: float | None) -> Any:
                got = admit(timeout)
                for key, request, _cancel in got or ():
                    names[key] = request.request_id
                    self.events.append(("handed", request.request_id))
                return got

            spoke: set[Hashable] = set()
            for key, pcm in inner(noting):
                if pcm is None:
                    self.events.append(("done", names[key]))
                elif key not in spoke:
                    spoke.add(key)
                    self.events.append(("first", names[key]))
                yield key, pcm

        engine.stream_continuous = stream_continuous

        def on_pass(_module: Any, _args: Any, _kwargs: Any) -> None:
            batcher = engine.batcher
            if batcher is not None:
                self.most_rows = max(self.most_rows, len(batcher.rows))
                self.most_in_batcher = max(self.most_in_batcher, len(batcher.rows) + len(batcher.waiting))
            self.most_held = max(self.most_held, self.held())

        self.handle = engine.chat.gpt.gpt.register_forward_pre_hook(on_pass, with_kwargs=True)

    def index(self, what: str, line: str) -> int:
        return self.events.index((what, line))

    def happened(self, what: str, line: str) -> bool:
        return (what, line) in self.events



async def test_rooms_speaking_after_a_flood_join_the_batch_before_its_next_lines(tiny_dir: Path) -> None:
    """Room F queues six lines; once F's first line sounds, three rooms say one line each. The
    engine took F's first ``CAP`` lines (nothing else was queued); every row that frees then goes
    to a single-line room (F has its audio buffered, they have none): each is handed over, and
    sounds, before F's line ``CAP + 1``. The batcher never holds more than ``CAP`` lines, nor
    runs more than ``max_batch`` rows."""
    engine = make_engine(tiny_dir, continuous=True, max_batch=MAX_BATCH, min_new_tokens=STEPS,
                         max_new_tokens=STEPS)
    rec = Recorder(engine)
    catalog = Catalog([VOICES["a"], VOICES["b"]], "a")
    pool = ContextPool(["cpu"], lambda device: {"chattts": engine}, catalog, queue_size=16, inflight=64)
    ctx = pool.contexts[0]
    rec.held = lambda: ctx._rows.held(engine)
    runner = asyncio.create_task(ctx.run(lambda utt: None))
    loop = asyncio.get_running_loop()

    def line(room: str, seq: int, text: str, voice: str) -> Utterance:
        job = Job(entry_id=f"{room}-{seq}", room=room, seq=seq, text=text, voice=voice, prev_voice=voice,
                  sender="t", time_ms=0.0)
        return Utterance(job=job, slices=SliceBuffer(loop))

    singles = [f"s{i}/1" for i in range(3)]
    nxt = f"F/{CAP + 1}"
    try:
        for seq in range(1, 7):
            assert pool.submit(line("F", seq, "The wolves wake up tonight.", "a")) is ctx
        await until(lambda: rec.happened("first", "F/1"), lambda: f"events: {rec.events}")
        for single in singles:
            assert pool.submit(line(single.split("/")[0], 1, "Good morning.", "b")) is ctx
        await until(lambda: all(rec.happened("first", s) for s in singles) and rec.happened("first", nxt),
                    lambda: f"events: {rec.events}")
    finally:
        rec.handle.remove()
        runner.cancel()
        ctx.close()
        engine.close()

    assert rec.most_held == CAP, rec.most_held
    assert rec.most_rows == MAX_BATCH and rec.most_in_batcher == CAP, (rec.most_rows, rec.most_in_batcher)
    handed = [name for what, name in rec.events if what == "handed"]
    assert handed[:CAP] == [f"F/{i}" for i in range(1, CAP + 1)], handed
    for single in singles:
        assert rec.index("handed", single) < rec.index("handed", nxt), handed
        assert rec.index("first", single) < rec.index("first", nxt), rec.events
