"""Continuous batching through the real ChatTTS modules on the tiny checkpoint: rows join the running
GPT batch at the next step and leave on EOS, end or cancel, and with argmax sampling each row's audio
is the audio of the same row run alone, whatever joined or left around it. Steps are counted (GPT
passes), never milliseconds."""

from __future__ import annotations

import threading
import time
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.chattts.conftest import make_engine, never, request
from workers.engines.base import ContinuousEngine, SynthesisRequest
from workers.engines.chattts import ChatTTSEngine

pytestmark = pytest.mark.chattts

ATOL = 2e-4  # as for windowed batches: left padding and batched matmuls change float rounding only
FIRST_CHUNK_STEPS = 8 + 8  # StreamConfig defaults: first_chunk_steps + holdback_steps


REPETITION = 3.0
"""Strong enough that a row fed another row's code history (or none) picks other codes."""


@pytest.fixture(scope="module")
def cont(tiny_dir: Path) -> Iterator[ChatTTSEngine]:
    """Greedy, continuous, 80 steps at most per piece, EOS allowed (some rows end early)."""
    e = make_engine(tiny_dir, temperature=0.0, fade_ms=0.0, continuous=True, min_new_tokens=1,
                    max_new_tokens=80, repetition_penalty=REPETITION)
    yield e
    e.close()


@dataclass
class Script:
    """Feeds ``stream_continuous``: ``joins[turn]`` rows are admitted at that turn (one turn = one
    GPT step); ``admit`` returns ``None`` once every scripted row is done. Records, per key, the
    chunks, when each arrived (GPT passes so far) and how often the row was reported done."""
    engine: ChatTTSEngine
    joins: dict[int, list[tuple[str, SynthesisRequest]]]
    cancels: dict[str, threading.Event] = field(default_factory=dict)
    chunks: dict[Hashable, list[np.ndarray]] = field(default_factory=dict)
    chunk_steps: dict[Hashable, list[int]] = field(default_factory=dict)
    joined_at: dict[Hashable, int] = field(default_factory=dict)
    done: dict[Hashable, int] = field(default_factory=dict)
    turn: int = 0

    def admit(self, timeout: float | None) -> list[tuple[Hashable, SynthesisRequest, threading.Event]] | None:
        if not self.joins and len(self.done) == len(self.joined_at):
            return None
        if timeout is not None and timeout > 0:
            # Nothing runs and a row waits for companions (continuous.py): time passes, no turn.
            time.sleep(timeout)
            return []
        if timeout is None and self.joins:  # nothing running: jump to the next scripted turn
            self.turn = max(self.turn, min(self.joins))
        rows = self.joins.pop(self.turn, [])
        self.turn += 1
        out: list[tuple[Hashable, SynthesisRequest, threading.Event]] = []
        for key, req in rows:
            self.joined_at[key] = self._steps()
            out.append((key, req, self.cancels.setdefault(key, threading.Event())))
        return out

    def _steps(self) -> int:
        return self.engine.batcher.steps if self.engine.batcher is not None else 0

    def run(self, on_chunk: Any = None) -> Script:
        for key, pcm in self.engine.stream_continuous(self.admit):
            if pcm is None:
                self.done[key] = self.done.get(key, 0) + 1
                continue
            assert pcm.dtype == np.float32 and pcm.ndim == 1
            assert self.done.get(key, 0) == 0, f"{key} spoke after it was done"
            self.chunks.setdefault(key, []).append(pcm)
            self.chunk_steps.setdefault(key, []).append(self._steps())
            if on_chunk is not None:
                on_chunk(self, key)
        return self

    def audio(self, key: str) -> np.ndarray:
        return np.concatenate(self.chunks[key]) if key in self.chunks else np.zeros(0, np.float32)


def solo(engine: ChatTTSEngine, req: SynthesisRequest) -> np.ndarray:
    """The same row alone, through the windowed path that ships today."""
    return np.concatenate([c for _, c in engine.stream_batch([req], [never()])])


def assert_same(got: np.ndarray, want: np.ndarray) -> None:
    assert len(got) == len(want) > 0
    np.testing.assert_allclose(got, want, atol=ATOL)


# Greedy on the tiny checkpoint: ONE/THREE/LONG run to the 80-step cap, EARLY meets EOS at step 48.
ONE = request("Good morning, room one.", "a")
THREE = request("the quick brown fox jumps", "c")
EARLY = request("A different sentence for room three.", "c")
LONG = request("A much longer line arrives late, with more words than any row already in the batch.", "b")


def test_continuous_is_an_engine_option(cont: ChatTTSEngine) -> None:
    assert isinstance(cont, ContinuousEngine) and cont.continuous and cont.max_batch > 1
    # The engine's own default stays windowed (the worker's setting turns it on, below).
    assert ChatTTSEngine().continuous is False


def test_the_setting_reaches_the_engine_the_worker_builds(tiny_dir: Path) -> None:
    """VOXROOM_CHATTTS_CONTINUOUS reaches the engine the worker builds: on by default, ``0``
    keeps windowed batches."""
    from voxroom.runtime.settings import Settings
    from workers.engines import registry
    from workers.launch import engine_options

    base = {"VOXROOM_CHATTTS_SOURCE": "custom", "VOXROOM_CHATTTS_DIR": str(tiny_dir)}
    for env, want in (({}, True), ({"VOXROOM_CHATTTS_CONTINUOUS": "0"}, False),
                      ({"VOXROOM_CHATTTS_CONTINUOUS": "1"}, True)):
        settings = Settings.from_env({**base, **env})
        engine = registry.create_engine("chattts", **engine_options("chattts", settings))
        assert getattr(engine, "continuous", None) is want


def test_a_row_joining_mid_batch_equals_its_solo_run(cont: ChatTTSEngine) -> None:
    """LONG joins at turn 20 with a longer prompt than the batch's (the running rows are padded on
    the left); a short row joins at turn 30 (it is padded instead). Every row equals its solo run."""
    short = request("Hi.", "a")
    s = Script(cont, {0: [("one", ONE), ("three", THREE)], 20: [("long", LONG)], 30: [("short", short)]}).run()
    assert s.done == {"one": 1, "three": 1, "long": 1, "short": 1}
    for key, req in (("one", ONE), ("three", THREE), ("long", LONG), ("short", short)):
        assert_same(s.audio(key), solo(cont, req))


def test_a_late_row_speaks_within_a_few_steps_of_joining(cont: ChatTTSEngine) -> None:
    """Its first chunk needs the GPT passes its first chunk needs alone (16: its prefill and 15
    decode steps) and the one step it waits for companions (a line handed over a moment after it
    joins with it), not the end of the batch it joined (80 steps for ONE and THREE)."""
    s = Script(cont, {0: [("one", ONE), ("three", THREE)], 20: [("late", LONG)]}).run()
    waited = s.chunk_steps["late"][0] - s.joined_at["late"]
    assert waited == 1 + FIRST_CHUNK_STEPS, waited  # a step for companions, then as alone
    # ... while the rows it joined were still mid-way: they spoke on after it did
    assert s.chunk_steps["one"][-1] > s.chunk_steps["late"][0]


def test_lines_handed_over_a_moment_apart_to_an_idle_engine_start_in_the_same_step(cont: ChatTTSEngine) -> None:
    """Issue 28.12: the serving thread took the line that had landed in its inbox and prefilled it
    alone; the lines handed over a moment later joined after it (one line's first audio at 2.16 s,
    the others' at 4.96 s). Here the second line comes at the engine's very next ``admit``, before
    the first has run a step: both join in one prefill and speak from the same step, each its solo
    run."""
    done: dict[Hashable, int] = {}
    first: dict[Hashable, int] = {}
    calls: list[float | None] = []

    def admit(timeout: float | None) -> list[tuple[Hashable, SynthesisRequest, threading.Event]] | None:
        calls.append(timeout)
        if len(calls) == 1:
            return [("a", ONE, never())]
        if len(calls) == 2:
            return [("b", THREE, never())]
        if len(done) == 2:
            return None
        if timeout is not None and timeout > 0:
            time.sleep(timeout)
        return []

    chunks: dict[Hashable, list[np.ndarray]] = {}
    for key, pcm in cont.stream_continuous(admit):
        if pcm is None:
            done[key] = done.get(key, 0) + 1
            continue
        assert isinstance(pcm, np.ndarray)
        assert cont.batcher is not None
        first.setdefault(key, cont.batcher.steps)
        chunks.setdefault(key, []).append(pcm)
    assert done == {"a": 1, "b": 1}
    assert first["a"] == first["b"], first
    for key, req in (("a", ONE), ("b", THREE)):
        assert_same(np.concatenate(chunks[key]), solo(cont, req))


def test_lines_admitted_a_turn_apart_into_a_running_batch_start_in_the_same_step(cont: ChatTTSEngine) -> None:
    """While LONG runs, one line is admitted at turn 10 and another at turn 11, a step apart: both
    join at turn 11 and speak from the same step; a line alone (turn 30) joins one turn after its
    admission. Every row is its solo run."""
    short = request("Hi.", "a")
    s = Script(cont, {0: [("long", LONG)], 10: [("one", ONE)], 11: [("three", THREE)], 30: [("short", short)]}).run()
    assert s.done == {"long": 1, "one": 1, "three": 1, "short": 1}
    assert s.chunk_steps["one"][0] == s.chunk_steps["three"][0], (s.chunk_steps["one"][0], s.chunk_steps["three"][0])
    assert s.chunk_steps["short"][0] - s.joined_at["short"] == 1 + FIRST_CHUNK_STEPS
    for key, req in (("long", LONG), ("one", ONE), ("three", THREE), ("short", short)):
        assert_same(s.audio(key), solo(cont, req))


def test_cancel_mid_batch_stops_that_row_and_leaves_the_others_unchanged(cont: ChatTTSEngine) -> None:
    """The row is cancelled as its first chunk is handed out (as the context does when a line hits
    VOXROOM_MAX_UTTERANCE_MS): it is not given another GPT step, yields nothing more, and is
    reported done once; the other rows are bit-for-bit (within rounding) their solo runs."""
    batch_sizes: list[int] = []
    handle = cont.chat.gpt.gpt.register_forward_pre_hook(
        lambda _m, _a, kw: batch_sizes.append(int(kw["inputs_embeds"].size(0))), with_kwargs=True)
    cut_at: list[int] = []

    def cut(script: Script, key: Hashable) -> None:
        if key == "cut" and not cut_at:
            script.cancels["cut"].set()
            cut_at.append(len(batch_sizes))

    try:
        s = Script(cont, {0: [("one", ONE), ("cut", LONG)], 5: [("three", THREE)]}).run(cut)
    finally:
        handle.remove()
    assert len(s.chunks["cut"]) == 1 and s.done["cut"] == 1
    # every GPT pass after the cut ran without the cut row: two rows, then one, never three
    assert cut_at and batch_sizes[cut_at[0] - 1] == 3
    assert max(batch_sizes[cut_at[0]:]) == 2
    for key, req in (("one", ONE), ("three", THREE)):
        assert_same(s.audio(key), solo(cont, req))


def test_a_row_ending_on_eos_leaves_the_others_unchanged(cont: ChatTTSEngine) -> None:
    early = solo(cont, EARLY)
    steps = (len(early) + 256) // 512
    assert len(early) == steps * 512 - 256 and 20 < steps < 60  # EOS mid-way; the others run to 80
    s = Script(cont, {0: [("one", ONE), ("early", EARLY)], 10: [("three", THREE)]}).run()
    assert s.done == {"one": 1, "early": 1, "three": 1}
    assert_same(s.audio("early"), early)
    for key, req in (("one", ONE), ("three", THREE)):
        assert_same(s.audio(key), solo(cont, req))


SWITCH = request("The first sentence is here. The second one follows, then a third. A fourth sentence "
                 "comes next. And finally the fifth.", voice="b", previous="a")


def test_a_multi_piece_utterance_moves_piece_to_piece_inside_the_batch(cont: ChatTTSEngine) -> None:
    """A voice switch: five pieces, each with its own speaker embedding, each piece joining at the
    step after the previous ended, while other rows come and go."""
    pieces, _ = cont.plan(SWITCH)
    assert len(pieces) == 5
    s = Script(cont, {0: [("switch", SWITCH), ("one", ONE)], 50: [("three", THREE)]}).run()
    assert s.done == {"switch": 1, "one": 1, "three": 1}
    for key, req in (("switch", SWITCH), ("one", ONE), ("three", THREE)):
        assert_same(s.audio(key), solo(cont, req))


def test_more_rows_than_max_batch_wait_for_a_slot(tiny_dir: Path) -> None:
    e = make_engine(tiny_dir, temperature=0.0, fade_ms=0.0, continuous=True, max_batch=2,
                    min_new_tokens=30, max_new_tokens=30)
    sizes: list[int] = []
    handle = e.chat.gpt.gpt.register_forward_pre_hook(
        lambda _m, _a, kw: sizes.append(int(kw["inputs_embeds"].size(0))), with_kwargs=True)
    try:
        reqs = {f"r{i}": request(f"Line number {i} of the queue.", "abc"[i % 3]) for i in range(5)}
        s = Script(e, {0: list(reqs.items())}).run()
        assert s.done == dict.fromkeys(reqs, 1)
        assert max(sizes) == 2  # never more than max_batch rows in a GPT pass
        for key, req in reqs.items():
            assert_same(s.audio(key), solo(e, req))
    finally:
        handle.remove()
        e.close()


STORY = request("The first sentence is here. The second one follows it. A third one ends the story.", "a")
PIECE = 30 * 512 - 256
"""Samples of one 30-step piece with no fades (0.63 s): every step is 512 samples, the last half
step held back."""


@pytest.mark.parametrize(("yield_ahead_s", "seconds_per_clock_read", "yields"), [
    (1.0, 0.0, True),  # the clock stands still: the story's lead is all its audio, 1.26 s after two pieces
    (2.0, 0.0, False),  # the default: 1.26 s is not far enough ahead
    (1.0, 10.0, False),  # the clock runs: what was made has been played, no lead at all
])
def test_a_line_far_ahead_of_its_playout_yields_its_row_at_a_piece_boundary(
        tiny_dir: Path, yield_ahead_s: float, seconds_per_clock_read: float, yields: bool) -> None:
    """One row (``max_batch`` 1): a three-piece story starts alone and a line joins at turn 5, to
    wait for the row. After the story's first piece its lead (0.63 s) is under ``yield_ahead_s``,
    so its second piece keeps the row. After the second (1.26 s) the late line takes the row
    before the third piece when that lead is far enough ahead; otherwise it waits for the whole
    story. Either way both lines are their solo runs."""
    e = make_engine(tiny_dir, temperature=0.0, fade_ms=0.0, continuous=True, max_batch=1, min_new_tokens=30,
                    max_new_tokens=30, max_piece_chars=40, yield_ahead_s=yield_ahead_s)
    now = [0.0]

    def clock() -> float:
        now[0] += seconds_per_clock_read
        return now[0]

    e.clock = clock
    heard: list[tuple[Hashable, int]] = []
    try:
        pieces, _ = e.plan(STORY)
        assert len(pieces) == 3
        s = Script(e, {0: [("story", STORY)], 5: [("late", ONE)]}).run(
            lambda script, key: heard.append((key, len(script.chunks[key][-1]))))
        assert s.done == {"story": 1, "late": 1}
        first_late = next(i for i, (key, _) in enumerate(heard) if key == "late")
        last_late = max(i for i, (key, _) in enumerate(heard) if key == "late")
        story_before = sum(n for key, n in heard[:first_late] if key == "story")
        assert story_before == (2 if yields else 3) * PIECE
        # the late line spoke whole, in one run, and the story went on after it only if it yielded
        assert all(key == "late" for key, _ in heard[first_late:last_late + 1])
        assert sum(n for key, n in heard[last_late:] if key == "story") == (PIECE if yields else 0)
        assert e.batcher is not None and e.batcher.yields == int(yields)
        for key, req in (("story", STORY), ("late", ONE)):
            assert_same(s.audio(key), solo(e, req))
    finally:
        e.close()


def test_the_yield_setting_reaches_the_engine_and_a_bad_one_is_refused(tiny_dir: Path) -> None:
    """VOXROOM_CHATTTS_YIELD_AHEAD_S reaches the engine the worker builds (2 s by default, ``inf``
    never yields); a negative or NaN value is refused with the setting's name."""
    from voxroom.errors import ConfigError, EngineError
    from voxroom.runtime.settings import Settings
    from workers.engines import registry
    from workers.launch import engine_options

    base = {"VOXROOM_CHATTTS_SOURCE": "custom", "VOXROOM_CHATTTS_DIR": str(tiny_dir)}
    for env, want in (({}, 2.0), ({"VOXROOM_CHATTTS_YIELD_AHEAD_S": "3.5"}, 3.5),
                      ({"VOXROOM_CHATTTS_YIELD_AHEAD_S": "inf"}, float("inf"))):
        engine = registry.create_engine("chattts", **engine_options("chattts", Settings.from_env({**base, **env})))
        assert getattr(engine, "yield_ahead_s", None) == want
    for bad in ("-1", "nan"):
        # Refused where the environment is read (voxroom/runtime/settings_rules.py), and by the engine
        # itself for settings built in code.
        with pytest.raises(ConfigError, match="VOXROOM_CHATTTS_YIELD_AHEAD_S"):
            Settings.from_env({**base, "VOXROOM_CHATTTS_YIELD_AHEAD_S": bad})
        settings = Settings.from_env(base).with_(chattts_yield_ahead_s=float(bad))
        with pytest.raises(EngineError, match="VOXROOM_CHATTTS_YIELD_AHEAD_S"):
            registry.create_engine("chattts", **engine_options("chattts", settings))


def test_admit_none_returns_and_a_bad_request_fails_alone(cont: ChatTTSEngine) -> None:
    from voxroom.voices.catalog import Voice

    unknown = SynthesisRequest(text="Who am I?", voice=Voice(id="zz", engine="chattts", language="eng",
                                                             params={"blend": [{"voice": "nobody", "weight": 1}]}))
    s = Script(cont, {0: [("bad", unknown), ("one", ONE)]}).run()
    assert s.done == {"bad": 1, "one": 1} and "bad" not in s.chunks
    assert_same(s.audio("one"), solo(cont, ONE))


# --- through the real context (workers/pool/context.py drives every continuous engine) ----------------

async def test_a_context_cut_at_max_utterance_stops_the_rows_gpt_steps(tiny_dir: Path) -> None:
    """The context cuts a line at ``max_slices`` (VOXROOM_MAX_UTTERANCE_MS) by setting its cancel
    while it hands out a chunk: the engine gives that row no further GPT step, and the context's
    next line is served by the same running engine."""
    import asyncio

    from tests.chattts.conftest import VOICES
    from voxroom.voices.catalog import Catalog
    from voxroom.wire.jobs import Job as LineJob
    from workers.pool.context import Context
    from workers.utterance import SliceBuffer, Utterance

    engine = make_engine(tiny_dir, temperature=0.0, fade_ms=0.0, continuous=True, min_new_tokens=80,
                         max_new_tokens=80)
    sizes: list[int] = []
    handle = engine.chat.gpt.gpt.register_forward_pre_hook(
        lambda _m, _a, kw: sizes.append(int(kw["inputs_embeds"].size(0))), with_kwargs=True)
    catalog = Catalog([VOICES["a"], VOICES["b"]], "a")
    ctx = Context("cpu#0", "cpu", {"chattts": engine}, catalog, queue_size=4, inflight=8, max_slices=10)
    runner = asyncio.create_task(ctx.run(lambda utt: None))

    def line(seq: int, text: str, voice: str) -> Utterance:
        job = LineJob(entry_id=f"{seq}-0", room=f"cut-{seq}", seq=seq, text=text, voice=voice, prev_voice=voice,
                      sender="t", time_ms=0)
        return Utterance(job=job, slices=SliceBuffer(asyncio.get_running_loop()))

    async def drain(utt: Utterance) -> int:
        n = 0
        while await utt.slices.get() is not None:
            n += 1
        return n

    try:
        cut = line(1, "This line runs far past its limit.", "a")
        await ctx.queue.put(cut)
        assert await asyncio.wait_for(drain(cut), 60) == 10 and cut.cancel.is_set()
        passes = len(sizes)
        nxt = line(2, "The next line.", "b")
        await ctx.queue.put(nxt)
        assert await asyncio.wait_for(drain(nxt), 60) == 10
    finally:
        handle.remove()
        runner.cancel()
        ctx.close()
        engine.close()
    # 10 slices (400 ms) end inside the second chunk, which comes at step 40 (16 to the first, 24
    # more): the row's prefill and 39 decode steps, not the 80 steps the line would take whole.
    assert passes == 40, passes
    assert len(sizes) == 80 and max(sizes) == 1


@pytest.mark.parametrize("option", ["int8", "bf16"])
def test_cpu_precision_options_batch_continuously(tiny_dir: Path, option: str) -> None:
    """The GPT's dtype (bf16 weights, or int8 quantised layers fed fp32) reaches every prefill and
    step: two rows, one joining mid-batch, each as long as its step budget, finite and not silent."""
    e = make_engine(tiny_dir, continuous=True, **{option: True})  # 60 steps a piece (conftest)
    try:
        s = Script(e, {0: [("one", ONE)], 7: [("two", THREE)]}).run()
    finally:
        e.close()
    assert s.done == {"one": 1, "two": 1}
    for key in ("one", "two"):
        audio = s.audio(key)
        assert len(audio) == 60 * 512 - 256 and np.isfinite(audio).all()
        assert float(np.sqrt(np.mean(audio**2))) > 1e-3
