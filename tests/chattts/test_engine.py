"""The engine as the pool uses it: streams, batches across rooms, per-row cancel, voice switches."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest
import torch

from tests.chattts.conftest import VOICES, collect, joins, never, request
from tests.support.audio import CLICK_RATIO, max_jump
from voxroom.errors import EngineError
from workers.engines.base import BatchEngine
from workers.engines.chattts import ChatTTSEngine
from workers.engines.chattts.speakers import transition

pytestmark = pytest.mark.chattts

RATE = 24_000
STEP_SAMPLES = 60 * 512 - 256  # the fixtures force 60 GPT steps per piece


def test_engine_protocol_and_audio(engine: ChatTTSEngine) -> None:
    assert isinstance(engine, BatchEngine) and engine.sample_rate == RATE and engine.max_batch == 8
    (audio,), (lengths,) = collect(((0, c) for c in engine.stream(request("Hello from the engine."), never())), 1)
    assert len(audio) == STEP_SAMPLES and len(lengths) >= 3
    assert np.isfinite(audio).all() and np.abs(audio).max() <= 1.0
    assert float(np.sqrt(np.mean(audio**2))) > 1e-3


def test_batch_rows_have_their_own_voice_and_equal_running_alone(greedy: ChatTTSEngine) -> None:
    reqs = [request("Good morning, room one.", "a"), request("Good morning, room one.", "b"),
            request("A different sentence for room three.", "c")]
    together, _ = collect(greedy.stream_batch(reqs, [never() for _ in reqs]), 3)
    alone = [collect(greedy.stream_batch([r], [never()]), 1)[0][0] for r in reqs]
    for t, a in zip(together, alone, strict=True):
        assert len(t) == len(a) == STEP_SAMPLES
        # left padding and batched matmuls change float rounding only
        np.testing.assert_allclose(t, a, atol=2e-4)
    # same text, different voice: different audio
    assert np.abs(together[0] - together[1]).max() > 1e-2


def test_cancel_one_row_leaves_the_others_untouched(greedy: ChatTTSEngine) -> None:
    reqs = [request("Room one keeps talking.", "a"), request("Room two is cancelled.", "b"),
            request("Room three keeps talking too.", "c")]
    cancels = [threading.Event() for _ in reqs]
    got: list[list[np.ndarray]] = [[], [], []]
    after_cancel = 0
    for row, chunk in greedy.stream_batch(reqs, cancels):
        if cancels[1].is_set() and row == 1:
            after_cancel += 1
        got[row].append(chunk)
        if row == 1:
            cancels[1].set()  # after its first chunk
    assert len(got[1]) == 1 and after_cancel == 0
    alone = [collect(greedy.stream_batch([reqs[i]], [never()]), 1)[0][0] for i in (0, 2)]
    for i, ref in zip((0, 2), alone, strict=True):
        np.testing.assert_allclose(np.concatenate(got[i]), ref, atol=2e-4)


def test_cancel_before_start_yields_nothing(engine: ChatTTSEngine) -> None:
    ev = threading.Event()
    ev.set()
    assert list(engine.stream(request("never spoken"), ev)) == []


def test_too_large_batch_is_refused(engine: ChatTTSEngine) -> None:
    with pytest.raises(EngineError, match="max_batch"):
        list(engine.stream_batch([request("x")] * 9, [never()] * 9))


SWITCH_TEXT = ("The first sentence is here. The second one follows, then a third. A fourth sentence "
               "comes next. And finally the fifth.")


def test_voice_switch_interpolates_embeddings_into_the_model(greedy: ChatTTSEngine) -> None:
    """Hook the transformer's input: each piece's [spk_emb] position must hold the interpolated vector."""
    seen: list[torch.Tensor] = []

    def hook(_m: Any, _a: Any, kwargs: dict[str, Any]) -> None:
        emb = kwargs["inputs_embeds"]
        if emb.size(1) > 1:
            seen.append(emb[0, 1].detach().float().clone())  # [Stts] [spk_emb] ...: one row, no padding

    req = request(SWITCH_TEXT, voice="b", previous="a")
    pieces, expected = greedy.plan(req)
    assert len(pieces) == 5
    handle = greedy.chat.gpt.gpt.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        list(greedy.stream(req, never()))
    finally:
        handle.remove()
    a, b = greedy.embedding(VOICES["a"]), greedy.embedding(VOICES["b"])
    assert len(seen) == 5
    for got, want in zip(seen, transition(a, b, 5, 5), strict=True):
        torch.testing.assert_close(got, want)
    cos_to_b = [float(torch.dot(s, b)) for s in seen]
    assert cos_to_b == sorted(cos_to_b) and cos_to_b[-1] == pytest.approx(1.0, abs=1e-5)
    assert float(torch.dot(seen[0], a)) > float(torch.dot(seen[0], b))  # starts near A


def test_short_utterance_still_ends_on_the_new_voice(engine: ChatTTSEngine) -> None:
    pieces, embs = engine.plan(request("Short.", voice="b", previous="a"))
    assert len(pieces) == 1
    torch.testing.assert_close(embs[0], engine.embedding(VOICES["b"]))


def test_no_clicks_at_chunk_piece_and_voice_boundaries(engine: ChatTTSEngine) -> None:
    """Threshold: tests.support.audio.CLICK_RATIO (12): the step at a join over the RMS of the steps
    within 5 ms around it (white noise ~4.5, a dropout 15-21). Every join is checked: streamed chunk
    joins (crossfaded), piece joins and the A->B voice steps (80 ms fades)."""
    (audio,), (lengths,) = collect(
        ((0, c) for c in engine.stream(request(SWITCH_TEXT, voice="b", previous="a"), never())), 1)
    assert len(audio) == 5 * STEP_SAMPLES
    at = joins(lengths)
    assert len(at) >= 14
    assert max_jump(audio, RATE, at=at) < CLICK_RATIO
    # piece boundaries are faded to silence on both sides
    edges = np.cumsum([STEP_SAMPLES] * 5)[:-1]
    assert max(abs(float(audio[e - 1])) + abs(float(audio[e])) for e in edges) < 1e-4
    assert abs(float(audio[0])) < 1e-4 and abs(float(audio[-1])) < 1e-4


@pytest.mark.parametrize("option", ["int8", "bf16"])
def test_cpu_precision_options_stream_audio(tiny_dir: Any, option: str) -> None:
    from tests.chattts.conftest import make_engine

    eng = make_engine(tiny_dir, **{option: True})
    try:
        quantized = type(eng.chat.gpt.gpt.layers[0].mlp.down_proj).__module__
        if option == "int8":
            assert "quantized" in quantized
        else:
            assert eng.chat.gpt.gpt.layers[0].mlp.down_proj.weight.dtype == torch.bfloat16
        (audio,), _ = collect(((0, c) for c in eng.stream(request("Precision check."), never())), 1)
        assert len(audio) == STEP_SAMPLES and np.isfinite(audio).all()
        assert float(np.sqrt(np.mean(audio**2))) > 1e-3
    finally:
        eng.close()


def test_int8_and_bf16_together_are_refused() -> None:
    with pytest.raises(EngineError, match="int8 or bf16"):
        ChatTTSEngine(int8=True, bf16=True)
