"""Run a real engine and keep its chunks with their arrival times."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from voxroom.voices.catalog import Voice
from workers.engines.base import Engine, SynthesisRequest


@dataclass
class Synthesis:
    chunks: list[npt.NDArray[np.float32]]
    arrivals_s: list[float]
    """Seconds from the call to ``stream`` to each chunk's arrival."""
    total_s: float
    rate: int
    cpu_arrivals_s: list[float] = field(default_factory=list)
    """CPU seconds this process spent (all its threads) from the call to each chunk's arrival: what
    the engine did before it, untouched by other processes on a busy machine, unlike wall time."""
    cpu_total_s: float = 0.0
    audio: npt.NDArray[np.float32] = field(init=False)

    def __post_init__(self) -> None:
        self.audio = (np.concatenate(self.chunks) if self.chunks else np.zeros(0, np.float32))

    @property
    def seconds(self) -> float:
        return self.audio.size / self.rate



def voice_with(base: Voice, **params: Any) -> Voice:
    """``base`` with extra or replaced engine params."""
    merged: Mapping[str, Any] = {**base.params, **params}
    return Voice(id=base.id, engine=base.engine, language=base.language, params=merged)


def synthesize(engine: Engine, voice: Voice, text: str, *, cancel_after: int | None = None,
               cancel: threading.Event | None = None) -> Synthesis:
    """Run one stream to its end; with ``cancel_after=n``, set the cancel event once ``n``
    chunks have arrived and keep reading to see what still comes."""
    cancel = cancel or threading.Event()
    chunks: list[npt.NDArray[np.float32]] = []
    arrivals: list[float] = []
    cpu_arrivals: list[float] = []
    started, cpu_started = time.perf_counter(), time.process_time()
    for chunk in engine.stream(SynthesisRequest(text=text, voice=voice, request_id="test"), cancel):
        arrivals.append(time.perf_counter() - started)
        cpu_arrivals.append(time.process_time() - cpu_started)
        assert chunk.dtype == np.float32 and chunk.ndim == 1
        chunks.append(chunk)
        if cancel_after is not None and len(chunks) >= cancel_after:
            cancel.set()
    return Synthesis(chunks, arrivals, time.perf_counter() - started, engine.sample_rate, cpu_arrivals,
                     time.process_time() - cpu_started)
