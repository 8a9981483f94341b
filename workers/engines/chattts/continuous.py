"""Continuous batching for ChatTTS: a row joins the running GPT batch at the next step and leaves
on EOS or cancel, instead of waiting for a batch window and for the whole batch to end.

One :class:`ContinuousBatcher` per context owns the batch (as TGI's router owns its queue): the
KV cache, one mask row, position and pending hidden state per row, and the jobs waiting for a
slot. Every turn of :meth:`ContinuousBatcher.serve` is one GPT step::

    admit()             new requests (blocks only when nothing runs)
    drop cancelled      their KV rows go before the step is paid for
    join                waiting pieces prefill together, their KV rows merge into the batch (kv.py)
    sample              one code per row; each row's own windowed decode and fades, as stream_batch
    drop cancelled      a cut set while a chunk was handed out stops the row here
    forward             one decode step for the rows left

A multi-piece utterance keeps its place: when a piece ends its next piece joins at the next step
(its own prefill, its own speaker embedding), before any newer request, unless its line is far
ahead of its playout while other lines wait for a row (:data:`YIELD_AHEAD_S`): then it yields
the row to them, at the piece boundary, where a row carries no KV state, so yielding costs
nothing. Per-row sampling state
(the repetition window, the minimum length, the step count) is the row's own, so with argmax
sampling a row's codes, and therefore its audio, are those of the same row run alone up to float
rounding, whatever joins or leaves around it.

Lines that arrive together start together. A new request waits one step for companions before it
joins: rows handed over within one step of each other join in one prefill and speak from the same
step (before, the serving thread took whichever line had landed in its inbox and prefilled it alone,
and lines handed over a moment later joined a step or, behind a busy loop, a piece later: one line's
first audio at 2.16 s, the three that arrived with it at 4.96 s). While the batch runs, a step is a
turn of :meth:`ContinuousBatcher.serve`: a request admitted at one turn joins at the next with every
request admitted there. While nothing runs, there is no turn to count: the first request waits the
measured duration of a step (:data:`FIRST_STEP_S` before one was measured, at most
:data:`MAX_JOIN_WAIT_S`) for others. The cost is one step of first-audio latency per line.

Word marks (a job with a ``timer``): when a piece's last chunk is out, the row yields that piece's
marks (``timing.PieceTimer`` over the piece's audio), right after the chunk: ChatTTS knows which
audio is which words only once a piece is done.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as F
from ChatTTS.model.processors import gen_logits
from transformers import DynamicCache

from workers.engines.base import Admit, Pcm, SynthesisRequest
from workers.engines.chattts import kv
from workers.engines.chattts.generation import Generator, SamplingParams, _has_float_params, _mask_or_none
from workers.engines.chattts.streaming import Fader, IncrementalDecoder
from workers.engines.chattts.timing import PieceTimer
from workers.engines.marks import WordMark

log = logging.getLogger("voxroom.engine.chattts")

Event = tuple[Hashable, Pcm | list[WordMark] | None]

YIELD_AHEAD_S = 2.0
"""A line whose audio runs this far ahead of its playout gives its row, at a piece boundary, to
lines waiting for one that are not (issue 14: "rows already playing far ahead of their deadline
may yield steps"). The lead is the line's audio made less the time since its first chunk: it
assumes playback began with that chunk, the earliest it could, so it never overstates what the
room has buffered (the room's earlier lines and the client's jitter buffer only add to it).
Two seconds: one that the issue says a room can wait, and one for the piece's prefill, its first
chunk and a row to come free again; the lead only falls from there, so a line that yielded
joins ahead of newer ones before its audio runs out. Mid-piece a row is not paused: that would
park its KV cache outside the batch, for a gain a piece later."""


FIRST_STEP_S = 0.03
"""What an idle batcher takes a step to last before it has measured one (a GPU step is 10-25 ms)."""
MAX_JOIN_WAIT_S = 0.25
"""The most a request waits for companions while nothing runs, whatever a step was measured at."""
STEP_EMA = 0.2
"""Weight of the latest step in the running estimate of a step's duration."""


@dataclass(slots=True, eq=False)  # a job is itself: compared by identity (``in``, ``remove``)
class Job:
    """One request: its text pieces, the speaker embedding of each, and where it is."""
    key: Hashable
    pieces: list[str]
    speakers: list[torch.Tensor]
    cancel: threading.Event
    piece: int = 0
    timer: PieceTimer | None = None
    """Gives each finished piece's word marks (over the request's text); ``None``: no marks."""
    heard_s: float = 0.0
    """Seconds of audio handed out so far, every piece."""
    started: float | None = None
    """The batcher's clock at the first chunk (``None`` before it)."""

    def lead(self, now: float) -> float:
        """Seconds of this line's audio not yet played at ``now``, at least: playback may have
        begun after the first chunk, never before (see :data:`YIELD_AHEAD_S`)."""
        return 0.0 if self.started is None else self.heard_s - (now - self.started)


@dataclass(slots=True)
class _Row:
    """One piece of a job in the GPT batch, with that piece's own decoder and fades."""
    job: Job
    decoder: IncrementalDecoder
    fader: Fader
    hiddens: list[torch.Tensor] = field(default_factory=list)
    heard: list[Pcm] = field(default_factory=list)
    """The piece's audio so far, for its marks (only when the job has a ``timer``)."""
    history: int = 0
    """Codes of this row in the repetition window (``codes``' rightmost columns)."""


Planner = Callable[[Hashable, SynthesisRequest, threading.Event], Job]
"""``(key, request, cancel)`` -> the request's :class:`Job`; raises ``EngineError`` for a bad one."""


class ContinuousBatcher:
    """The running batch of one context. Not thread-safe: the context's thread drives it."""

    def __init__(self, gen: Generator, params: SamplingParams, *, max_rows: int,
                 normalize: Callable[[str], str], new_decoder: Callable[[], IncrementalDecoder],
                 new_fader: Callable[[], Fader], on_done: Callable[[], None], sample_rate: int,
                 yield_ahead_s: float = YIELD_AHEAD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.gen = gen
        self.params = params
        self.max_rows = max_rows
        """GPT rows at once; further requests wait (FIFO) for a row to leave. The context hands
        over at most one more line than that (``workers/pool/continuous_rows.py``, ``SPARE_ROWS``): which line
        takes a freed row is its job queue's choice, not this FIFO's."""
        self.normalize = normalize
        self.new_decoder = new_decoder
        self.new_fader = new_fader
        self.on_done = on_done
        self.sample_rate = sample_rate
        self.yield_ahead_s = yield_ahead_s
        self.clock = clock
        llama = gen.llama
        self.llama = llama
        self.dtype = next(llama.parameters()).dtype if _has_float_params(llama) else torch.float32
        self.warpers, self.processors = gen_logits(num_code=gen.num_code, top_P=params.top_p, top_K=params.top_k,
                                                   repetition_penalty=params.repetition_penalty)
        # Only the repetition penalty looks back, and only over its window (16 codes upstream).
        self.window = max((int(getattr(p, "past_window", 0)) for p in self.processors), default=0)
        self.steps = 0
        """GPT forward passes (prefills and decode steps) so far, for tests and benchmarks."""
        self.yields = 0
        """Times a line far ahead of its playout let a waiting line take a row first."""
        self.waiting: deque[Job] = deque()
        self.fresh: list[Job] = []
        """Requests admitted and not yet released to ``waiting``: they wait a step for companions."""
        self._fresh_since = 0.0
        """``time.monotonic()`` when ``fresh`` last went from empty to not."""
        self.step_s: float | None = None
        """Running estimate of one decode step (sample and forward), in seconds of ``time.monotonic``:
        the wait for companions is a wait on the inbox, in real time, whatever ``clock`` says."""
        self._reset()

    def _reset(self) -> None:
        self.rows: list[_Row] = []
        self.cache: DynamicCache | None = None
        dev = self.gen.device
        self.mask = torch.zeros(0, 0, dtype=torch.long, device=dev)
        self.last_pos = torch.zeros(0, dtype=torch.long, device=dev)
        self.hidden = torch.zeros(0, 0, device=dev)
        self.codes = torch.zeros(0, self.gen.num_vq, self.window, dtype=torch.long, device=dev)
        self.idx: torch.Tensor | None = None

    # --- the loop --------------------------------------------------------------------------------
    def serve(self, admit: Admit, plan: Planner) -> Iterator[Event]:
        """Yield ``(key, chunk)`` as rows produce audio and ``(key, None)`` once per request when
        it is done (finished, cancelled, or refused by ``plan``); return when ``admit`` returns
        ``None``."""
        while True:
            admitted = admit(self._admit_timeout())
            if admitted is None:
                return
            new: list[Job] = []
            for key, request, cancel in admitted:
                try:
                    job = plan(key, request, cancel)
                except Exception:  # one bad request must not fail the rows running beside it
                    log.exception("chattts: request %s refused", key)
                    yield key, None
                    continue
                if job.pieces:
                    new.append(job)
                else:  # nothing to say (no speakable text)
                    self.on_done()
                    yield key, None
            self._arrive(new)
            yield from self._drop_cancelled()
            free = self.max_rows - len(self.rows)
            if free > 0 and self.waiting:
                self._join(self._take(free))
            if not self.rows:
                continue
            began = time.monotonic()
            yield from self._sample()
            yield from self._drop_cancelled()
            if self.rows:
                self._forward()
                took = time.monotonic() - began
                self.step_s = took if self.step_s is None else (1 - STEP_EMA) * self.step_s + STEP_EMA * took

    # --- companions: requests that arrive together join together ------------------------------
    def _admit_timeout(self) -> float | None:
        """How long ``admit`` may block: not at all while rows run or wait; while nothing runs, until
        the fresh requests' step of waiting for companions is over; else until a request comes."""
        if self.rows or self.waiting:
            return 0.0
        if self.fresh:
            return max(0.0, self._fresh_since + self._join_wait() - time.monotonic())
        return None

    def _join_wait(self) -> float:
        return min(MAX_JOIN_WAIT_S, FIRST_STEP_S if self.step_s is None else self.step_s)

    def _arrive(self, new: list[Job]) -> None:
        """Requests admitted this turn wait in ``fresh``; release every fresh request to ``waiting``
        once the oldest has waited a step: a turn while rows run, the step's duration while none do."""
        if self.rows:
            ready = bool(self.fresh)  # admitted at an earlier turn: a step ago
        else:
            ready = bool(self.fresh) and time.monotonic() >= self._fresh_since + self._join_wait()
        if new and not self.fresh:
            self._fresh_since = time.monotonic()
        self.fresh += new
        if ready:
            self.waiting.extend(self.fresh)
            self.fresh = []

    # --- rows in and out -------------------------------------------------------------------------
    def _drop_cancelled(self) -> list[Event]:
        events: list[Event] = []
        for job in [j for j in self.waiting if j.cancel.is_set()]:
            self.waiting.remove(job)
            events.append((job.key, None))
        for job in [j for j in self.fresh if j.cancel.is_set()]:
            self.fresh.remove(job)
            events.append((job.key, None))
        gone = [row for row in self.rows if row.job.cancel.is_set()]
        if gone:
            self._keep([i for i, row in enumerate(self.rows) if not row.job.cancel.is_set()])
            events += [(row.job.key, None) for row in gone]
        return events

    def _take(self, free: int) -> list[Job]:
        """The waiting jobs that get the ``free`` rows, out of the queue: in their order, except
        that when more wait than there are rows, lines far ahead of their playout
        (:data:`YIELD_AHEAD_S`) go after the lines that are not."""
        if len(self.waiting) <= free:
            taken = list(self.waiting)
            self.waiting.clear()
            return taken
        now = self.clock()
        queued = list(self.waiting)
        order = sorted(queued, key=lambda job: job.lead(now) >= self.yield_ahead_s)  # stable
        taken = order[:free]
        self.yields += sum(1 for job in queued[:free] if job not in taken)
        self.waiting = deque(order[free:])
        return taken

    @torch.inference_mode()
    def _join(self, jobs: list[Job]) -> None:
        """Prefill the jobs' current pieces together (left-padded among themselves) and merge
        their KV rows, positions and first hidden states into the batch."""
        gen = self.gen
        texts = [self.normalize(j.pieces[j.piece]) for j in jobs]
        emb, mask = gen.prepare(texts, [j.speakers[j.piece] for j in jobs], self.params)
        mask = mask.to(gen.device).long()
        position = (mask.cumsum(-1) - 1).clamp_(min=0)
        cache = DynamicCache(config=self.llama.config)
        out = self.llama(inputs_embeds=emb.to(self.dtype), attention_mask=_mask_or_none(mask),
                         position_ids=position, cache=cache, use_cache=True)
        self.steps += 1
        hidden = out.last_hidden_state[:, -1].float()
        if self.cache is None:
            self.cache, self.mask, self.hidden = cache, mask, hidden
            self.last_pos = position[:, -1]
        else:
            self.mask = kv.merge(self.cache, self.mask, cache, mask)
            self.hidden = torch.cat([self.hidden, hidden])
            self.last_pos = torch.cat([self.last_pos, position[:, -1]])
        self.codes = torch.cat([self.codes, self.codes.new_zeros(len(jobs), *self.codes.shape[1:])])
        self.rows += [_Row(j, self.new_decoder(), self.new_fader()) for j in jobs]

    def _keep(self, keep: list[int]) -> None:
        """Keep only the rows at ``keep`` (batch positions); cut columns no row uses any more."""
        if len(keep) == len(self.rows):
            return
        if not keep:
            self._reset()
            return
        assert self.cache is not None
        sel = torch.tensor(keep, device=self.gen.device)
        self.rows = [self.rows[i] for i in keep]
        self.cache.batch_select_indices(sel)
        self.mask, self.last_pos, self.hidden, self.codes = (self.mask[sel], self.last_pos[sel],
                                                             self.hidden[sel], self.codes[sel])
        if self.idx is not None:
            self.idx = self.idx[sel]
        self.mask = kv.trim(self.cache, self.mask)

    # --- one step ---------------------------------------------------------------------------------
    @torch.inference_mode()
    def _sample(self) -> list[Event]:
        """Pick every row's next code from its pending hidden state; hand out the audio that is
        ready; end the pieces that hit EOS or ``max_new_tokens``."""
        idx = self._pick()
        eos = idx.eq(self.gen.num_code).any(1).tolist()
        keep: list[int] = []
        events: list[Event] = []
        next_pieces: list[Job] = []
        for i, row in enumerate(self.rows):
            ended = bool(eos[i])
            if not ended:
                # the hidden that produced a non-EOS code is that code's decoder input (as upstream)
                row.hiddens.append(self.hidden[i])
                ended = len(row.hiddens) >= self.params.max_new_tokens
            if not ended:
                keep.append(i)
                if row.decoder.ready(len(row.hiddens)):
                    events += self._audio(row, final=False)
                continue
            events += self._audio(row, final=True)
            job = row.job
            job.piece += 1
            if job.piece < len(job.pieces):
                next_pieces.append(job)
            else:
                self.on_done()
                events.append((job.key, None))
        # An utterance's next piece keeps its place ahead of newer requests (unless far ahead: _take).
        self.waiting.extendleft(reversed(next_pieces))
        if self.window:
            self.codes = torch.cat([self.codes[:, :, 1:], idx.unsqueeze(-1)], dim=2)
            for row in self.rows:
                row.history = min(row.history + 1, self.window)
        self.idx = idx
        self._keep(keep)
        return events

    def _audio(self, row: _Row, *, final: bool) -> list[Event]:
        chunk = row.decoder.emit(row.hiddens, final)
        job = row.job
        events: list[Event] = []
        if len(chunk):
            out = row.fader.apply(np.clip(chunk, -1.0, 1.0), final)
            if job.started is None:
                job.started = self.clock()
            job.heard_s += len(out) / self.sample_rate
            if job.timer is not None:
                row.heard.append(out)
            events.append((job.key, out))
        if final and job.timer is not None:
            audio = np.concatenate(row.heard) if row.heard else np.zeros(0, np.float32)
            marks = job.timer.piece(job.pieces[job.piece], audio)
            if marks:
                events.append((job.key, marks))
        return events

    def _pick(self) -> torch.Tensor:
        """``(B, num_vq)`` codes. ChatTTS's processors and warpers, with the repetition penalty fed
        each row's own history: rows whose windows hold as many codes go through it together."""
        gen, params = self.gen, self.params
        b, q = len(self.rows), gen.num_vq
        logits = torch.einsum("bh,qch->bqc", self.hidden, gen.head)
        if params.temperature > 0:
            logits = logits / params.temperature
        if self.processors:
            by_length: dict[int, list[int]] = {}
            for i, row in enumerate(self.rows):
                by_length.setdefault(row.history, []).append(i)
            for n, members in by_length.items():
                whole = len(members) == b  # the usual case once every row has spoken 16 steps
                sel = None if whole else torch.tensor(members, device=logits.device)
                codes = self.codes if sel is None else self.codes[sel]
                part = (logits if sel is None else logits[sel]).reshape(len(members) * q, -1)
                history = codes[:, :, self.window - n:].reshape(len(members) * q, n)
                for proc in self.processors:
                    part = proc(history, part)
                if sel is None:
                    logits = part.view(b, q, -1)
                else:
                    logits[sel] = part.view(len(members), q, -1)
        flat = logits.reshape(b * q, -1)
        empty = self.codes.new_zeros(b * q, 0)
        for warp in self.warpers:  # top-P / top-K: per row, no history
            flat = warp(empty, flat)
        young = [i for i, row in enumerate(self.rows) if len(row.hiddens) < params.min_new_tokens]
        if young:
            flat = flat.view(b, q, -1)
            flat[torch.tensor(young, device=flat.device), :, gen.num_code] = -torch.inf
            flat = flat.view(b * q, -1)
        if params.temperature <= 0:
            picked = flat.argmax(-1)
        else:
            picked = torch.multinomial(F.softmax(flat, dim=-1), 1, generator=gen.rng).squeeze(1)
        return picked.view(b, q)

    @torch.inference_mode()
    def _forward(self) -> None:
        """One decode step: every row's picked code in, every row's next hidden state out."""
        assert self.idx is not None and self.cache is not None
        idx, self.idx = self.idx, None
        emb_code = self.gen.emb_code
        nxt = torch.stack([emb_code[k](idx[:, k]) for k in range(self.gen.num_vq)], 2).sum(2)
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.size(0), 1)], dim=1)
        self.last_pos = self.last_pos + 1
        out = self.llama(inputs_embeds=nxt.unsqueeze(1).to(self.dtype), attention_mask=_mask_or_none(self.mask),
                         position_ids=self.last_pos.unsqueeze(1), cache=self.cache, use_cache=True)
        self.steps += 1
        self.hidden = out.last_hidden_state[:, -1].float()
