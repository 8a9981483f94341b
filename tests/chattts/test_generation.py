"""Our generation loop against ChatTTS's own ``GPT.generate``, and per-row speaker embeddings."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.chattts.conftest import VOICES
from workers.engines.chattts import ChatTTSEngine
from workers.engines.chattts.generation import RowProgress, SamplingParams

pytestmark = pytest.mark.chattts


@pytest.mark.filterwarnings("ignore:.*past_key_values.*:FutureWarning")  # upstream's call, not ours
def test_greedy_loop_matches_upstream_generate(greedy: ChatTTSEngine) -> None:
    """Same weights, same maths: with argmax sampling our loop yields upstream's hidden states."""
    chat = greedy.chat
    text = chat.normalizer("hello world, this is voxroom.", True, True, None)
    spk = greedy.embedding(VOICES["a"])
    steps = 40
    rows = [RowProgress()]
    params = SamplingParams(temperature=0.0, min_new_tokens=steps, max_new_tokens=steps)
    assert greedy._gen is not None
    for _ in greedy._gen.run([text], [spk], params, rows, lambda i: False):
        pass
    from ChatTTS import Chat

    # temperature 1e-6 turns upstream's multinomial into argmax (its softmax is one-hot)
    up = Chat.InferCodeParams(spk_emb=spk.cpu(), temperature=1e-6, min_new_token=steps, max_new_token=steps,
                              show_tqdm=False)
    result = next(chat._infer_code([text], False, chat.device, True, up))
    theirs = result.hiddens[0]
    ours = torch.stack(rows[0].hiddens)
    assert ours.shape == theirs.shape == (steps, 64)
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=1e-4)


def _prefill_embeds(engine: ChatTTSEngine) -> tuple[list[torch.Tensor], Any]:
    seen: list[torch.Tensor] = []

    def hook(_module: Any, _args: Any, kwargs: dict[str, Any]) -> None:
        emb = kwargs["inputs_embeds"]
        if emb.size(1) > 1:  # the prefill, not a one-token step
            seen.append(emb.detach().float().clone())

    return seen, engine.chat.gpt.gpt.register_forward_pre_hook(hook, with_kwargs=True)


def test_each_row_gets_its_own_speaker_embedding(greedy: ChatTTSEngine) -> None:
    seen, handle = _prefill_embeds(greedy)
    try:
        spks = [greedy.embedding(VOICES[v]) for v in ("a", "b", "c")]
        rows = [RowProgress() for _ in spks]
        assert greedy._gen is not None
        # different text lengths, so rows are left-padded differently
        texts = ["hello", "hello there my friend", "one two three four five six"]
        list(greedy._gen.run(texts, spks, SamplingParams(temperature=0.0, min_new_tokens=5, max_new_tokens=5),
                             rows, lambda i: False))
    finally:
        handle.remove()
    (emb,) = seen
    ids, _, _ = greedy.chat.tokenizer.encode(
        greedy.chat.speaker.decorate_code_prompts(texts, "[speed_5]", None, "x"), 4)
    for r, spk in enumerate(spks):
        pos = (ids[r, :, 0] == greedy.chat.tokenizer.spk_emb_ids).nonzero().flatten()
        assert pos.numel() == 1
        torch.testing.assert_close(emb[r, int(pos)], spk)


def test_blend_seed_and_string_voices(engine: ChatTTSEngine) -> None:
    a, b = engine.embedding(VOICES["a"]), engine.embedding(VOICES["b"])
    ab = engine.embedding(VOICES["ab"])
    torch.testing.assert_close(ab, torch.nn.functional.normalize(0.6 * a + 0.4 * b, dim=0))
    assert engine.embedding(VOICES["ab"]) is ab  # cached: a voice switch is a dict lookup
    assert abs(float(a.norm()) - 1.0) < 1e-5 and not torch.allclose(a, b)
    # ChatTTS's own string form round-trips (float16 precision)
    from voxroom.voices.catalog import Voice

    text_form = engine.chat.speaker._encode(a)
    s = engine.embedding(Voice(id="s", engine="chattts", language="eng", params={"embedding": text_form}))
    torch.testing.assert_close(s, a, atol=2e-3, rtol=0)


def test_seed_voice_is_upstreams_seeded_random_speaker(engine: ChatTTSEngine) -> None:
    """{"seed": N} names the speaker `torch.manual_seed(N); chat.sample_random_speaker()` gives."""
    from voxroom.voices.catalog import Voice

    torch.manual_seed(2222)
    upstream = engine.chat.speaker._sample_random()
    ours = engine.embedding(Voice(id="s2222", engine="chattts", language="cmn", params={"seed": 2222}))
    torch.testing.assert_close(ours, torch.nn.functional.normalize(upstream.float(), dim=0))
