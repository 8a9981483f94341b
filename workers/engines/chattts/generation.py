"""Our own GPT generation loop over ChatTTS's modules, batched, with a speaker embedding per row.

Why not ``Chat.infer``/``GPT.generate``: upstream applies one speaker embedding to the whole batch
(``Speaker.apply``), can only stop every row at once (``Chat.interrupt``), samples from the process-wide
RNG (its ``manual_seed`` re-seeds on *every* step), keeps per-step attention lists, and passes the
``past_key_values`` argument that transformers 5 deprecates. This loop uses the same weights and the same
maths (ChatTTS's tokenizer, ``Embed``, ``LlamaModel``, code heads and logits processors), and adds:

* a speaker embedding per row, written at each row's ``[spk_emb]`` token;
* rows that leave the batch (EOS or cancelled) are dropped from the KV cache, so a cancelled room costs
  nothing from its next step on and never stops the other rows;
* a seeded ``torch.Generator`` per context;
* hidden states handed out every ``stream_every`` steps, so decoding can start long before upstream's 72.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from ChatTTS.model.processors import gen_logits
from transformers import DynamicCache


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """ChatTTS's ``InferCodeParams`` defaults (temperature 0.3, top-P 0.7, top-K 20, repetition 1.05).
    ``temperature=0`` means greedy, used by tests that compare a row in a batch with the same row alone."""
    prompt: str = "[speed_5]"
    temperature: float = 0.3
    top_p: float = 0.7
    top_k: int = 20
    repetition_penalty: float = 1.05
    max_new_tokens: int = 2048
    min_new_tokens: int = 0


@dataclass(slots=True)
class RowProgress:
    """What a row has produced so far: hidden states (one per GPT step, decoder input) and codes."""
    hiddens: list[torch.Tensor] = field(default_factory=list)
    done: bool = False
    hit_eos: bool = False


@dataclass(frozen=True, slots=True)
class StepReport:
    """Yielded every ``stream_every`` steps and when rows end: which rows got new hiddens or ended."""
    step: int
    changed: tuple[int, ...]
    ended: tuple[int, ...]


class Generator:
    """Drives one batch. Not thread-safe; one per engine context."""

    def __init__(self, chat: Any, rng: torch.Generator) -> None:
        self.chat = chat
        self.rng = rng
        gpt = chat.gpt
        self.llama = gpt.gpt
        self.num_vq: int = gpt.num_vq
        self.num_code: int = gpt.num_audio_tokens - 1  # the last audio token is EOS
        self.device = chat.device
        self.spk_emb_id: int = chat.tokenizer.spk_emb_ids
        # The code heads are weight-normed Linear layers; upstream recomputes weight = g * v/|v| per step
        # (under P.cached). We compute the four effective weight matrices once.
        with torch.no_grad():
            self.head = torch.stack([h.weight.detach().float() for h in chat.embed.head_code]).to(self.device)
        self.emb_code = chat.embed.emb_code

    def prepare(self, texts: Sequence[str], speakers: Sequence[torch.Tensor],
                params: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and embeddings for a batch; ``speakers[i]`` (unit norm) goes into row ``i``."""
        chat = self.chat
        decorated = chat.speaker.decorate_code_prompts(list(texts), params.prompt, None, "x")
        input_ids, attention_mask, text_mask = chat.tokenizer.encode(
            decorated, self.num_vq, device=chat.device_gpt)
        emb = chat.embed(input_ids, text_mask).clone()  # inference tensor -> ordinary tensor
        spk = torch.stack([s.to(emb.device, emb.dtype) for s in speakers])  # (B, H)
        where = input_ids[..., 0].eq(self.spk_emb_id).to(emb.device)  # (B, L)
        emb = torch.where(where.unsqueeze(-1), spk.unsqueeze(1).expand_as(emb), emb)
        return emb, attention_mask

    @torch.inference_mode()
    def run(self, texts: Sequence[str], speakers: Sequence[torch.Tensor], params: SamplingParams,
            rows: list[RowProgress], cancelled: Callable[[int], bool],
            stream_every: int = 4) -> Iterator[StepReport]:
        """Generate until every row ended (EOS, ``max_new_tokens`` or ``cancelled(row)``), appending each
        row's hidden states to ``rows[i].hiddens`` and yielding a report every ``stream_every`` steps."""
        emb, mask = self.prepare(texts, speakers, params)
        dtype = next(self.llama.parameters()).dtype if _has_float_params(self.llama) else torch.float32
        batch = emb.size(0)
        active = torch.arange(batch)  # batch position -> row index
        mask = mask.to(self.device).long()
        position = (mask.cumsum(-1) - 1).clamp_(min=0)
        cache = DynamicCache(config=self.llama.config)
        out = self.llama(inputs_embeds=emb.to(dtype), attention_mask=_mask_or_none(mask),
                         position_ids=position, cache=cache, use_cache=True)
        hidden = out.last_hidden_state[:, -1].float()
        last_pos = position[:, -1]
        codes = torch.zeros(batch, self.num_vq, 0, dtype=torch.long, device=self.device)
        warpers, processors = gen_logits(num_code=self.num_code, top_P=params.top_p, top_K=params.top_k,
                                         repetition_penalty=params.repetition_penalty)
        changed: set[int] = set()
        ended: list[int] = []
        step = 0
        while active.numel() > 0 and step < params.max_new_tokens:
            # drop cancelled rows before paying for their next step
            keep = [i for i, r in enumerate(active.tolist()) if not cancelled(r)]
            if len(keep) < active.numel():
                for i, r in enumerate(active.tolist()):
                    if i not in keep:
                        rows[r].done = True
                        ended.append(r)
                if not keep:
                    break
                sel = torch.tensor(keep, device=self.device)
                active, hidden, mask, last_pos, codes = (active[keep], hidden[sel], mask[sel],
                                                         last_pos[sel], codes[sel])
                cache.batch_select_indices(sel)
            idx = self._sample(hidden, codes, step, params, warpers, processors)  # (b, num_vq)
            eos = idx.eq(self.num_code).any(1)
            for i, r in enumerate(active.tolist()):
                if eos[i]:
                    rows[r].done = rows[r].hit_eos = True
                    ended.append(r)
                else:
                    # the hidden that produced a non-EOS code is that code's decoder input (as upstream)
                    rows[r].hiddens.append(hidden[i])
                    changed.add(r)
            step += 1
            if eos.any():
                sel = (~eos).nonzero().squeeze(1)
                active, idx, mask, last_pos, codes = (active[sel.cpu()], idx[sel], mask[sel], last_pos[sel],
                                                      codes[sel])
                cache.batch_select_indices(sel)
            if step % stream_every == 0 or ended:
                yield StepReport(step, tuple(sorted(changed)), tuple(ended))
                changed.clear()
                ended = []
            if active.numel() == 0 or step >= params.max_new_tokens:
                break
            codes = torch.cat([codes, idx.unsqueeze(-1)], dim=2)
            nxt = torch.stack([self.emb_code[q](idx[:, q]) for q in range(self.num_vq)], 2).sum(2)
            mask = torch.cat([mask, mask.new_ones(mask.size(0), 1)], dim=1)
            last_pos = last_pos + 1
            out = self.llama(inputs_embeds=nxt.unsqueeze(1).to(dtype), attention_mask=_mask_or_none(mask),
                             position_ids=last_pos.unsqueeze(1), cache=cache, use_cache=True)
            hidden = out.last_hidden_state[:, -1].float()
        for r in active.tolist():
            if not rows[r].done:
                rows[r].done = True
                ended.append(r)
        if changed or ended:
            yield StepReport(step, tuple(sorted(changed)), tuple(ended))

    def _sample(self, hidden: torch.Tensor, codes: torch.Tensor, step: int, params: SamplingParams,
                warpers: list[Any], processors: list[Any]) -> torch.Tensor:
        b = hidden.size(0)
        logits = torch.einsum("bh,qch->bqc", hidden, self.head).reshape(b * self.num_vq, -1)
        history = codes.reshape(b * self.num_vq, -1)
        if params.temperature > 0:
            logits = logits / params.temperature
        for proc in (*processors, *warpers):
            logits = proc(history, logits)
        if step < params.min_new_tokens:
            logits[:, self.num_code] = -torch.inf
        if params.temperature <= 0:
            idx = logits.argmax(-1)
        else:
            probs = F.softmax(logits, dim=-1)
            idx = torch.multinomial(probs, 1, generator=self.rng).squeeze(1)
        return idx.view(b, self.num_vq)


def _mask_or_none(mask: torch.Tensor) -> torch.Tensor | None:
    """No padding in the batch (always so for one row): no mask, so attention takes its plain causal
    path instead of building a 4-D mask every step."""
    return None if bool(mask.all()) else mask


def _has_float_params(module: torch.nn.Module) -> bool:
    p = next(module.parameters(), None)
    return p is not None and p.is_floating_point()
