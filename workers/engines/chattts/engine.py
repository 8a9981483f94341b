"""``ChatTTSEngine``: one ChatTTS context (one ``Chat``, one device), batched streaming synthesis.

The pool creates one engine per device (``cuda:N``, or each CPU context) and calls it from that context's
thread only (see ``workers/engines/base.py``). Nothing here is shared between engines: each has its own
``Chat``, its own seeded ``torch.Generator`` and its own speaker-embedding cache.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from voxroom.errors import EngineError
from voxroom.voices.catalog import Voice
from voxroom.voices.text_split import MAX_PIECE_CHARS, split_for_transition, split_text
from workers.engines.base import Admit, Pcm, SynthesisRequest
from workers.engines.chattts.continuous import YIELD_AHEAD_S, ContinuousBatcher, Job
from workers.engines.chattts.generation import Generator, RowProgress, SamplingParams
from workers.engines.chattts.loader import load_chat
from workers.engines.chattts.speakers import SPEAKER_CACHE, SpeakerBank, VoiceLookup, switch_steps, transition
from workers.engines.chattts.streaming import Fader, IncrementalDecoder, StreamConfig
from workers.engines.chattts.timing import PieceTimer
from workers.engines.marks import WordMark

log = logging.getLogger("voxroom.engine.chattts")


@dataclass(slots=True)
class _Plan:
    """One request: its text pieces and the speaker embedding of each piece."""
    pieces: list[str]
    speakers: list[torch.Tensor]


class ChatTTSEngine:
    """ChatTTS on one device. Options (all keyword, all with defaults):

    ``source``/``custom_path``/``sha256_map``: where weights come from (see ``loader.load_chat``);
    ``int8``: dynamic int8 quantisation of the GPT's linear layers (CPU contexts only); ``bf16``: the
    GPT in bfloat16 on a CPU context;
    ``fp16``: half-precision GPT on CUDA (default on); ``empty_cache_every``: call
    ``torch.cuda.empty_cache()`` every N utterances; ``interpolation_steps``/``fade_ms``: voice switches;
    ``max_batch``; ``seed`` of this context's sampler; sampling (``temperature``, ``top_p``, ``top_k``,
    ``repetition_penalty``, ``max_new_tokens``, ``min_new_tokens``); streaming (``first_chunk_steps``,
    ``chunk_steps``, ``left_context_steps``, ``holdback_steps``, ``overlap_samples``);
    ``max_piece_chars``; ``voice_lookup`` (resolves blend parts; e.g. ``catalog.get``); ``speaker_cache``
    (embeddings kept, least recently used evicted: a client can name any mix);
    ``torch_threads`` (intra-op threads of this process, when set); ``continuous`` (with ``max_batch``
    > 1 the pool drives :meth:`stream_continuous`: rows join the running batch at the next GPT step);
    ``word_marks`` (:meth:`stream_batch` and :meth:`stream_continuous` also yield each row's word
    marks, piece by piece: see :meth:`stream_timed`. Off by default so that a caller that reads
    only audio gets only audio; the pool's wrapper, which maps the marks to the line as sent,
    turns it on: workers/engines/wrappers.py); ``yield_ahead_s`` (a continuous row whose line is this
    far ahead of its playout gives its row to waiting lines at its next piece boundary:
    ``continuous.YIELD_AHEAD_S``).
    """

    name = "chattts"
    sample_rate = 24000

    def __init__(self, *, source: str = "huggingface", custom_path: str | None = None,
                 sha256_map: dict[str, str] | None = None, int8: bool = False, fp16: bool = True,
                 bf16: bool = False,
                 empty_cache_every: int = 50, interpolation_steps: int = 5, fade_ms: float = 80.0,
                 max_batch: int = 8, seed: int = 0, temperature: float = 0.3, top_p: float = 0.7,
                 top_k: int = 20, repetition_penalty: float = 1.05, max_new_tokens: int = 2048,
                 min_new_tokens: int = 1, first_chunk_steps: int = 8, chunk_steps: int = 24,
                 left_context_steps: int = 16, holdback_steps: int = 8, overlap_samples: int = 1024,
                 max_piece_chars: int = MAX_PIECE_CHARS, voice_lookup: VoiceLookup | None = None,
                 torch_threads: int | None = None, continuous: bool = False,
                 speaker_cache: int = SPEAKER_CACHE, word_marks: bool = False,
                 yield_ahead_s: float = YIELD_AHEAD_S) -> None:
        if interpolation_steps < 1 or max_batch < 1 or fade_ms < 0:
            raise EngineError("chattts: interpolation_steps and max_batch must be >= 1, fade_ms >= 0")
        if int8 and bf16:
            raise EngineError("chattts: choose int8 or bf16, not both")
        if not yield_ahead_s >= 0:  # NaN too
            raise EngineError(f"chattts: yield_ahead_s (VOXROOM_CHATTTS_YIELD_AHEAD_S) must be at least 0 "
                              f"(inf: never yield), got {yield_ahead_s}")
        if speaker_cache < 1:
            raise EngineError(f"chattts: speaker_cache (VOXROOM_CHATTTS_SPEAKER_CACHE) must be at least 1, "
                              f"got {speaker_cache}")
        self.source = source
        self.custom_path = custom_path
        self.sha256_map = sha256_map
        self.int8 = int8
        self.fp16 = fp16
        self.bf16 = bf16
        self.empty_cache_every = empty_cache_every
        self.interpolation_steps = interpolation_steps
        self.fade_samples = round(fade_ms * self.sample_rate / 1000)
        self.max_batch = max_batch
        self.continuous = continuous
        self.word_marks = word_marks
        self.seed = seed
        # min_new_tokens >= 1: a row that ends at step 0 would be silent (upstream regenerates instead).
        self.sampling = SamplingParams(temperature=temperature, top_p=top_p, top_k=top_k,
                                       repetition_penalty=repetition_penalty, max_new_tokens=max_new_tokens,
                                       min_new_tokens=max(1, min_new_tokens))
        self.stream_config = StreamConfig(first_chunk_steps=first_chunk_steps, chunk_steps=chunk_steps,
                                          left_context_steps=left_context_steps, holdback_steps=holdback_steps,
                                          overlap_samples=overlap_samples)
        self.max_piece_chars = max_piece_chars
        self.voice_lookup = voice_lookup
        self.torch_threads = torch_threads
        self.speaker_cache = speaker_cache
        self.chat: Any = None
        self.device = torch.device("cpu")
        self._gen: Generator | None = None
        self._bank: SpeakerBank | None = None
        self._utterances = 0
        self.yield_ahead_s = yield_ahead_s
        self.clock: Callable[[], float] = time.monotonic
        """What continuous rows' leads are measured on (``continuous.YIELD_AHEAD_S``; tests stop it)."""
        self.batcher: ContinuousBatcher | None = None
        """The running batch of :meth:`stream_continuous` (its ``steps`` count GPT passes)."""

    # --- lifecycle -------------------------------------------------------------------------------
    def load(self, device: str) -> None:
        """Load the model onto ``device``. Raises ``ModelNotFound`` / ``EngineError``."""
        if self.torch_threads:
            torch.set_num_threads(self.torch_threads)
        self.device = torch.device(device)
        if self.device.type == "cuda" and not torch.cuda.is_available():
            raise EngineError(f"chattts: {device} requested but CUDA is not available")
        chat = load_chat(source=self.source, custom_path=self.custom_path, device=str(self.device),
                         sha256_map=self.sha256_map)
        llama = chat.gpt.gpt
        if self.device.type == "cuda" and self.fp16:
            # Only the transformer: code heads, decoder and Vocos stay fp32 (cheap, and Vocos' ISTFT
            # wants fp32). generation.py casts the transformer's inputs to its dtype.
            chat.gpt.gpt = llama.half()
        elif self.int8:
            if self.device.type != "cpu":
                raise EngineError("chattts: int8 dynamic quantisation is for CPU contexts")
            chat.gpt.gpt = _quantize_int8(llama)
        elif self.bf16:
            # One GPT step at batch 1 reads every weight once: the step is memory-bound, and bf16 halves
            # the bytes (FACTS: real-time factor 2.8 -> 1.4 on these CPUs).
            chat.gpt.gpt = llama.to(torch.bfloat16)
        self.chat = chat
        rng = torch.Generator(device=self.device).manual_seed(self.seed)
        self._gen = Generator(chat, rng)
        self._bank = SpeakerBank(chat.speaker, self.device, self.voice_lookup, capacity=self.speaker_cache)
        log.info("chattts context ready on %s (gpt dtype %s, int8=%s)", self.device,
                 _gpt_dtype(chat.gpt.gpt), self.int8)

    def close(self) -> None:
        self.chat = None
        self._gen = None
        self._bank = None
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    # --- voices ----------------------------------------------------------------------------------
    def embedding(self, voice: Voice) -> torch.Tensor:
        """The unit-norm speaker embedding for ``voice`` (cached)."""
        return self._require()[1].embedding(voice)

    def plan(self, request: SynthesisRequest) -> tuple[list[str], list[torch.Tensor]]:
        """The text pieces of ``request`` and the embedding each piece is spoken with: on a voice switch
        (``previous_voice`` differs) the pieces step from the old voice to the new one, over the part
        of the switch the request covers (``switch_range``; a switch spread over several lines gives
        each its part, docs/chattts.md "Voice switches"). ``interpolation_steps`` counts the steps of
        a whole switch: a line covering a third of it is cut into a third as many pieces."""
        bank = self._require()[1]
        pieces = split_text(request.text, self.max_piece_chars)
        target = bank.embedding(request.voice)
        prev = request.previous_voice
        start, end = (min(1.0, max(0.0, x)) for x in request.switch_range)
        if prev is None or prev.id == request.voice.id or prev.engine != self.name or not pieces \
                or start >= 1.0 or end < start:
            return pieces, [target] * len(pieces)
        steps = switch_steps(self.interpolation_steps, start, end)
        pieces = split_for_transition(pieces, steps)
        return pieces, transition(bank.embedding(prev), target, len(pieces), steps, start, end)

    # --- synthesis -------------------------------------------------------------------------------
    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm]:
        for _, item in self._batch([request], [cancel], marks=False):
            if not isinstance(item, list):
                yield item

    def stream_timed(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm | list[WordMark]]:
        """:meth:`stream`'s audio and the line's word marks (``workers.engines.base.TimedEngine``).
        ChatTTS knows which of its audio is which words only by text piece (``split_text``): when a
        piece's last chunk is out, the piece's words are spread over its voiced audio
        (``timing.PieceTimer``), so each piece's marks come right *after* that piece's audio,
        never before it. Offsets index ``request.text`` as given (before ChatTTS's normalizer);
        times count from the line's first sample. A cancelled line gets no more marks."""
        for _, item in self._batch([request], [cancel], marks=True):
            yield item

    def stream_batch(self, requests: Sequence[SynthesisRequest],
                     cancel: Sequence[threading.Event]) -> Iterator[tuple[int, Pcm | list[WordMark]]]:
        """Synthesize up to ``max_batch`` requests together, each row with its own voice; yield
        ``(row, chunk)`` as soon as a row's chunk is decoded and, with ``word_marks`` set,
        ``(row, marks)`` right after the last chunk of each of the row's text pieces (as
        :meth:`stream_timed`). Text pieces go in rounds: round ``k`` batches piece ``k`` of every
        row that has one. A row whose ``cancel`` is set leaves the batch at the next GPT step (its
        KV-cache rows are dropped) and yields nothing more; other rows go on.
        ``Chat.interrupt()`` is never used: it would stop every stream of this ``Chat``."""
        return self._batch(requests, cancel, marks=self.word_marks)

    def _batch(self, requests: Sequence[SynthesisRequest], cancel: Sequence[threading.Event], *,
               marks: bool) -> Iterator[tuple[int, Pcm | list[WordMark]]]:
        gen, _ = self._require()
        if len(requests) != len(cancel):
            raise EngineError("stream_batch: one cancel event per request")
        if len(requests) > self.max_batch:
            raise EngineError(f"stream_batch: {len(requests)} requests, max_batch is {self.max_batch}")
        plans = [_Plan(*self.plan(r)) for r in requests]
        timers = [PieceTimer(r.text, self.sample_rate) if marks else None for r in requests]
        rounds = max((len(p.pieces) for p in plans), default=0)
        for k in range(rounds):
            rows = [r for r, p in enumerate(plans) if k < len(p.pieces) and not cancel[r].is_set()]
            if not rows:
                break
            yield from self._round(gen, [plans[r].pieces[k] for r in rows],
                                   [plans[r].speakers[k] for r in rows], rows, cancel,
                                   [timers[r] for r in rows])
        for r, p in enumerate(plans):
            if p.pieces and not cancel[r].is_set():
                self._utterance_done()

    def stream_continuous(self, admit: Admit) -> Iterator[tuple[Hashable, Pcm | list[WordMark] | None]]:
        """Continuous batching (see ``continuous.py``): up to ``max_batch`` rows in the GPT batch,
        each joining at the next step and leaving on EOS or cancel; further requests wait for a row.
        Yields ``(key, chunk)``, with ``word_marks`` set ``(key, marks)`` right after the last chunk
        of each text piece (as :meth:`stream_timed`), and ``(key, None)`` once per request;
        returns when ``admit`` returns ``None``."""
        gen, _ = self._require()
        chat = self.chat
        log.info("chattts continuous batching on %s: up to %d rows a step", self.device, self.max_batch)

        def plan(key: Hashable, request: SynthesisRequest, cancel: threading.Event) -> Job:
            pieces, speakers = self.plan(request)
            timer = PieceTimer(request.text, self.sample_rate) if self.word_marks else None
            return Job(key, pieces, speakers, cancel, timer=timer)

        self.batcher = ContinuousBatcher(
            gen, self.sampling, max_rows=self.max_batch,
            normalize=lambda text: str(chat.normalizer(text, True, True, None)),
            new_decoder=lambda: IncrementalDecoder(self._decode, self.stream_config),
            new_fader=lambda: Fader(self.fade_samples), on_done=self._utterance_done,
            sample_rate=self.sample_rate, yield_ahead_s=self.yield_ahead_s, clock=self.clock)
        yield from self.batcher.serve(admit, plan)

    def _round(self, gen: Generator, texts: list[str], speakers: list[torch.Tensor], rows: list[int],
               cancel: Sequence[threading.Event],
               timers: list[PieceTimer | None]) -> Iterator[tuple[int, Pcm | list[WordMark]]]:
        chat = self.chat
        # The model reads the normalized text; the marks (``timers``) are over the text as split.
        normed = [chat.normalizer(t, True, True, None) for t in texts]
        progress = [RowProgress() for _ in rows]
        decoders = [IncrementalDecoder(self._decode, self.stream_config) for _ in rows]
        faders = [Fader(self.fade_samples) for _ in rows]
        finished = [False] * len(rows)
        heard: list[list[Pcm]] = [[] for _ in rows]  # each row's audio of this piece, for its marks

        def cancelled(i: int) -> bool:
            return cancel[rows[i]].is_set()

        for report in gen.run(normed, speakers, self.sampling, progress, cancelled):
            for i in sorted(set(report.changed) | set(report.ended)):
                if finished[i]:
                    continue
                if cancelled(i):
                    finished[i] = True
                    continue
                final = progress[i].done
                hiddens = progress[i].hiddens
                if not final and not decoders[i].ready(len(hiddens)):
                    continue
                chunk = decoders[i].emit(hiddens, final)
                if final:
                    finished[i] = True
                if len(chunk):
                    out = faders[i].apply(np.clip(chunk, -1.0, 1.0), final)
                    if timers[i] is not None:
                        heard[i].append(out)
                    yield rows[i], out
                timer = timers[i]
                if final and timer is not None and not cancelled(i):
                    marks = timer.piece(texts[i], np.concatenate(heard[i]) if heard[i] else np.zeros(0, np.float32))
                    if marks:
                        yield rows[i], marks

    @torch.inference_mode()
    def _decode(self, hiddens: torch.Tensor) -> Pcm:
        """Hidden states ``(T, H)`` -> ``512*T - 256`` samples through ChatTTS's decoder and Vocos."""
        chat = self.chat
        x = hiddens.t().unsqueeze(0).contiguous()
        mel = chat.decoder(x)
        wav = chat.vocos.decode(mel)
        out: Pcm = wav[0].float().cpu().numpy()
        return out

    def _utterance_done(self) -> None:
        self._utterances += 1
        if self.device.type == "cuda" and self.empty_cache_every > 0 \
                and self._utterances % self.empty_cache_every == 0:
            # The caching allocator keeps the peak of every batch shape it saw; long-running contexts
            # with varied batch sizes creep up unless it is emptied now and then.
            torch.cuda.empty_cache()

    def _require(self) -> tuple[Generator, SpeakerBank]:
        if self._gen is None or self._bank is None:
            raise EngineError("chattts engine used before load()")
        return self._gen, self._bank


def _gpt_dtype(module: torch.nn.Module) -> str:
    p = next(module.parameters(), None)
    return "none" if p is None else str(p.dtype).replace("torch.", "")


def _quantize_int8(llama: torch.nn.Module) -> torch.nn.Module:
    """Dynamic int8 quantisation of the transformer's Linear layers (weights int8, activations
    quantised per batch on the fly): about 3x faster per step on these CPUs (FACTS)."""
    import warnings

    from torch.ao.quantization import quantize_dynamic

    with warnings.catch_warnings():
        # torch.ao.quantization announces its move to torchao; the API still works in 2.13.
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", UserWarning)
        quantized: torch.nn.Module = quantize_dynamic(  # type: ignore[no-untyped-call]
            llama, {torch.nn.Linear}, dtype=torch.qint8)
        return quantized
