"""A voice switch spread over the room's following lines, from the gateway's ``say`` script (real
redis-server) to the speaker embedding that enters the tiny ChatTTS model: lines too short to be
cut still glide from A to B, one step a line, and the switch's last line is the new voice exactly."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest
import torch
from redis.asyncio import Redis

from tests.chattts.conftest import VOICES, collect, make_engine, never, request
from tests.support.stores import Stores
from voxroom.store import keys
from voxroom.voices.catalog import Catalog
from voxroom.wire.jobs import Job
from workers.engines.base import SynthesisRequest
from workers.engines.chattts import ChatTTSEngine
from workers.engines.chattts.speakers import interpolate
from workers.engines.wrappers import wrap
from workers.utterance import switch_of

CATALOG = Catalog(list(VOICES.values()), "a")
LINE = "Good evening."
"""One piece that cannot be cut (two halves of 12 characters at least): only the following lines
can carry the switch further."""


async def _requests(redis_url: str, room: str, voices: list[str], switch_lines: int, stores: Stores) -> list[SynthesisRequest]:
    """What the worker builds for each line the room says (workers/pool/context.py ``_request``)."""
    r = Redis.from_url(redis_url, decode_responses=True)
    ingress = await stores.ingress(r, switch_lines=switch_lines)
    try:
        for n, voice in enumerate(voices, start=1):
            assert (await ingress.say(room, "amy", n, LINE, voice)).status == "accepted"
        stream = cast(list[tuple[str, dict[str, str]]], await r.xrange(keys.JOBS))
        entries = [(i, f) for i, f in stream if f["room"] == room]
    finally:
        await ingress.aclose()
        await r.aclose()
    out = []
    for entry_id, fields in entries:
        job = Job.from_entry(entry_id, fields)
        switch = switch_of(job, CATALOG)
        out.append(SynthesisRequest(text=job.text, voice=CATALOG.get(job.voice), request_id=f"{room}/{job.seq}",
                                    previous_voice=switch.previous_voice, switch_range=switch.switch_range))
    return out


@contextmanager
def speaker_inputs(engine: ChatTTSEngine) -> Iterator[list[torch.Tensor]]:
    """The ``[spk_emb]`` vector of every prefill the transformer runs (one row, no padding)."""
    seen: list[torch.Tensor] = []

    def hook(_m: Any, _a: Any, kwargs: dict[str, Any]) -> None:
        emb = kwargs["inputs_embeds"]
        if emb.size(1) > 1:
            seen.append(emb[0, 1].detach().float().clone())

    handle = engine.chat.gpt.gpt.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _speak(engine: ChatTTSEngine, req: SynthesisRequest) -> np.ndarray:
    (audio,), _ = collect(((0, c) for c in engine.stream(req, never())), 1)
    return audio


async def test_one_piece_lines_step_from_a_to_b_across_the_lines(greedy: ChatTTSEngine, redis_url: str,
                                                                 room: str, stores: Stores) -> None:
    reqs = await _requests(redis_url, room, ["a", "b", "b", "b", "b"], switch_lines=3, stores=stores)
    a, b = greedy.embedding(VOICES["a"]), greedy.embedding(VOICES["b"])
    audio = []
    with speaker_inputs(greedy) as seen:
        for req in reqs:
            pieces, _ = greedy.plan(req)
            assert pieces == [LINE]
            audio.append(_speak(greedy, req))
    assert len(seen) == 5
    want = [a, interpolate(a, b, 1 / 3), interpolate(a, b, 2 / 3), b, b]
    for got, expected in zip(seen, want, strict=True):
        torch.testing.assert_close(got, expected)
    cos_to_b = [float(torch.dot(s, b)) for s in seen]
    assert cos_to_b[0] < cos_to_b[1] < cos_to_b[2] < cos_to_b[3] == pytest.approx(1.0, abs=1e-6)
    # Heard (argmax sampling: the same input gives the same samples, 0.0 apart): the switch's first
    # two lines are neither voice, its last line is B to the sample. A third of the way the tiny
    # random model samples A's tokens still, only their sound moves (measured max 1.2e-3 from A's);
    # two thirds of the way the tokens differ too (0.13 from both, as far as A is from B).
    pure_a, pure_b = _speak(greedy, request(LINE, "a")), _speak(greedy, request(LINE, "b"))
    np.testing.assert_array_equal(audio[0], pure_a)
    assert all(x.shape == pure_a.shape for x in audio)
    assert 5e-4 < float(np.max(np.abs(audio[1] - pure_a))) and float(np.max(np.abs(audio[1] - pure_b))) > 5e-2
    assert float(np.max(np.abs(audio[2] - pure_a))) > 5e-2 and float(np.max(np.abs(audio[2] - pure_b))) > 5e-2
    np.testing.assert_array_equal(audio[3], pure_b)
    np.testing.assert_array_equal(audio[4], pure_b)


def test_a_line_that_can_be_cut_steps_through_its_part(greedy: ChatTTSEngine) -> None:
    """A line covering the middle third of a five-step switch is cut into ceil(5/3) = 2 pieces,
    which step through that third; the whole switch in one line keeps its five pieces."""
    a, b = greedy.embedding(VOICES["a"]), greedy.embedding(VOICES["b"])
    text = "The first sentence is here, and the second one follows."
    middle = SynthesisRequest(text=text, voice=VOICES["b"], previous_voice=VOICES["a"], switch_range=(1 / 3, 2 / 3))
    pieces, embs = greedy.plan(middle)
    assert pieces == ["The first sentence is here,", "and the second one follows."]
    for got, t in zip(embs, (0.5, 2 / 3), strict=True):
        torch.testing.assert_close(got, interpolate(a, b, t))
    long = ("The first sentence is here. The second one follows, then a third. A fourth sentence "
            "comes next. And finally the fifth.")
    whole, embs = greedy.plan(request(long, voice="b", previous="a"))
    assert len(whole) == 5
    assert embs[-1] is b


def test_a_line_cut_at_its_pauses_shares_its_part_between_the_pieces(tiny_dir: Path) -> None:
    """ChatTTS one line at a time goes through ``NarratorEngine``, which speaks the words between
    pauses as separate requests: they step through the line's part of the switch in order."""
    narrator = wrap(make_engine(tiny_dir, max_batch=1, temperature=0.0))
    try:
        inner = narrator.inner
        assert isinstance(inner, ChatTTSEngine)
        a, b = inner.embedding(VOICES["a"]), inner.embedding(VOICES["b"])
        line = SynthesisRequest(text=f"{LINE} [pause:300] Good night.", voice=VOICES["b"],
                                previous_voice=VOICES["a"], switch_range=(1 / 3, 2 / 3))
        with speaker_inputs(inner) as seen:
            audio = np.concatenate(list(narrator.stream(line, never())))
        assert len(seen) == 2 and audio.size > 0
        torch.testing.assert_close(seen[0], interpolate(a, b, 0.5))
        torch.testing.assert_close(seen[1], interpolate(a, b, 2 / 3))
    finally:
        narrator.close()
