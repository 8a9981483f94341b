"""Streaming encoders for ``POST /v1/audio/speech``: int16 PCM at the room rate in, bytes out.

``pcm`` and ``wav`` need nothing; ``opus`` (Ogg Opus), ``mp3``, ``flac`` and ``aac`` (ADTS) use
PyAV's muxers (the ``opus`` extra) and are offered only where PyAV has the encoder. Every encoder
hands out bytes as soon as its container has them: PyAV writes through a 256-byte buffer and Ogg
pages are cut every 40 ms, so the first bytes of a long line leave within one slice or two.

``flac`` is the exception: FLAC's STREAMINFO block, at the start of the file, holds the total
sample count and the MD5 of the audio, which libsndfile (``soundfile.read``) insists on; a stream
cannot know them up front. So FLAC is muxed into memory and handed out whole when the line ends
(still a chunked response, but one piece), with a STREAMINFO every reader accepts.

``speed`` other than 1 goes through FFmpeg's ``atempo`` filter (tempo changed, pitch kept).
Whatever needs PyAV where PyAV is missing is refused by :func:`refusal` (a 400), never raised
from :func:`make_encoder` mid-request.
These encoders do blocking CPU work in small steps (well under a millisecond per 40 ms slice):
callers run them on the event loop only for that reason.
"""

from __future__ import annotations

import importlib
import io
import struct
from typing import Any, Final, Protocol

import numpy as np
import numpy.typing as npt

from voxroom.wire.protocol import ROOM_RATE

CONTENT_TYPES: Final = {"pcm": "audio/pcm", "wav": "audio/wav", "opus": "audio/ogg", "mp3": "audio/mpeg",
                        "flac": "audio/flac", "aac": "audio/aac"}
_CONTAINERS: Final = {"opus": ("ogg", "libopus"), "mp3": ("mp3", "libmp3lame"), "flac": ("flac", "flac"),
                      "aac": ("adts", "aac")}
MIN_SPEED: Final = 0.25
MAX_SPEED: Final = 4.0
SPEED_EPSILON: Final = 1e-3
"""A ``speed`` this close to 1 is 1: no tempo filter."""


class Encoder(Protocol):
    def feed(self, pcm: npt.NDArray[np.int16]) -> bytes: ...

    def finish(self) -> bytes: ...


PYAV_MODULE = "av"
"""The module :func:`_av` imports; tests point it at a missing name to see a gateway without PyAV."""


def _av() -> Any:
    """PyAV, or ``None`` where it is not installed: the one place that decides."""
    try:
        if PYAV_MODULE == "av":
            import av  # spelled out: the image's dependency check (tests/ops) reads imports from the source

            return av
        return importlib.import_module(PYAV_MODULE)
    except ImportError:
        return None


def refusal(fmt: object, speed: float) -> tuple[str, str, str] | None:
    """Why ``fmt`` at ``speed`` cannot be encoded here, as ``(message, code, param)``, or ``None``
    when :func:`make_encoder` will build it. The caller answers 400 with it."""
    formats = available_formats()
    if fmt not in formats:
        lacks = _av() is None and fmt in _CONTAINERS
        why = " (this server lacks PyAV: pip install 'voxroom[opus]')" if lacks else ""
        return f"'response_format' must be one of {', '.join(formats)}{why}", "unsupported_format", "response_format"
    if abs(speed - 1.0) >= SPEED_EPSILON and _av() is None:
        return ("'speed' other than 1.0 needs PyAV, which this server lacks (pip install 'voxroom[opus]')",
                "unsupported_speed", "speed")
    return None


def available_formats() -> list[str]:
    """What this gateway can answer: ``pcm`` and ``wav`` always, the rest where PyAV encodes them."""
    av = _av()
    found = ["wav", "pcm"]
    if av is not None:
        found += [name for name, (_, codec) in _CONTAINERS.items() if codec in av.codecs_available]
    return found


def wav_header(rate: int = ROOM_RATE) -> bytes:
    """A streaming WAV header: the sizes are unknown, so they say 0xFFFFFFFF (as OpenAI's do).
    Readers take the data up to the end of the file."""
    return (b"RIFF" + struct.pack("<I", 0xFFFFFFFF) + b"WAVEfmt " +
            struct.pack("<IHHIIHH", 16, 1, 1, rate, rate * 2, 2, 16) + b"data" + struct.pack("<I", 0xFFFFFFFF))


class _Raw:
    def __init__(self, header: bytes = b"") -> None:
        self._header = header

    def feed(self, pcm: npt.NDArray[np.int16]) -> bytes:
        out, self._header = self._header + pcm.astype("<i2").tobytes(), b""
        return out

    def finish(self) -> bytes:
        out, self._header = self._header, b""
        return out


class _Sink(io.RawIOBase):
    """Where PyAV's muxer writes; ``take`` hands out what arrived since the last call."""

    def __init__(self) -> None:
        self._parts: list[bytes] = []

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._parts.append(bytes(data))
        return len(data)

    def take(self) -> bytes:
        out = b"".join(self._parts)
        self._parts.clear()
        return out


class _Container:
    def __init__(self, av: Any, fmt: str, *, rate: int = ROOM_RATE) -> None:
        container, codec = _CONTAINERS[fmt]
        self._av = av
        # FLAC: a seekable buffer, so that the muxer goes back and writes STREAMINFO's totals.
        self._whole: io.BytesIO | None = io.BytesIO() if fmt == "flac" else None
        self._sink = _Sink()
        options = {"page_duration": "40000"} if container == "ogg" else {}
        self._out = av.open(self._whole if self._whole is not None else self._sink, mode="w", format=container,
                            buffer_size=256, options=options)
        # Opus takes 24 kHz; mp3 (MPEG-2 layer III), FLAC and AAC take it too.
        self._stream = self._out.add_stream(codec, rate=rate)
        self._stream.layout = "mono"
        if fmt == "opus":
            self._stream.codec_context.options = {"application": "voip"}
        self._rate = rate
        self._pts = 0

    def feed(self, pcm: npt.NDArray[np.int16]) -> bytes:
        frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1),
                                                 format="s16", layout="mono")
        frame.sample_rate = self._rate
        frame.pts = self._pts
        self._pts += int(pcm.size)
        for packet in self._stream.encode(frame):
            self._out.mux(packet)
        return self._sink.take()

    def finish(self) -> bytes:
        for packet in self._stream.encode(None):
            self._out.mux(packet)
        self._out.close()
        if self._whole is not None:
            return self._whole.getvalue()
        return self._sink.take()


class _Tempo:
    """``atempo`` in front of another encoder. One atempo stage takes 0.5-2.0; stages multiply."""

    def __init__(self, av: Any, speed: float, inner: Encoder, *, rate: int = ROOM_RATE) -> None:
        self._av = av
        self._inner = inner
        self._rate = rate
        self._pts = 0
        graph = av.filter.Graph()
        node = source = graph.add_abuffer(format="s16", sample_rate=rate, layout="mono", time_base=f"1/{rate}")
        for stage in _tempo_stages(speed):
            nxt = graph.add("atempo", f"{stage:.6f}")
            node.link_to(nxt)
            node = nxt
        sink = graph.add("abuffersink")
        node.link_to(sink)
        graph.configure()
        self._graph = graph  # the filter contexts die with their graph: keep it alive
        self._source, self._sinknode = source, sink

    def _drain(self) -> bytes:
        out = b""
        while True:
            try:
                frame = self._sinknode.pull()
            except (self._av.error.BlockingIOError, self._av.error.EOFError):
                return out
            out += self._inner.feed(frame.to_ndarray().reshape(-1).astype(np.int16))

    def feed(self, pcm: npt.NDArray[np.int16]) -> bytes:
        frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1),
                                                 format="s16", layout="mono")
        frame.sample_rate = self._rate
        frame.pts = self._pts
        self._pts += int(pcm.size)
        self._source.push(frame)
        return self._drain()

    def finish(self) -> bytes:
        self._source.push(None)
        return self._drain() + self._inner.finish()


def _tempo_stages(speed: float) -> list[float]:
    stages = []
    while speed > 2.0:
        stages.append(2.0)
        speed /= 2.0
    while speed < 0.5:
        stages.append(0.5)
        speed /= 0.5
    return [*stages, speed]


def make_encoder(fmt: str, speed: float = 1.0) -> Encoder:
    """An encoder for ``fmt`` (one of :func:`available_formats`). Raises ``ValueError`` otherwise,
    or when ``speed`` is out of range or needs PyAV that is missing."""
    if not MIN_SPEED <= speed <= MAX_SPEED:
        raise ValueError(f"speed must be between {MIN_SPEED} and {MAX_SPEED}")
    if fmt not in available_formats():
        raise ValueError(f"response_format must be one of {', '.join(available_formats())}")
    av = _av()
    inner: Encoder = (_Raw(wav_header()) if fmt == "wav" else _Raw() if fmt == "pcm" else _Container(av, fmt))
    if abs(speed - 1.0) < SPEED_EPSILON:
        return inner
    if av is None:
        raise ValueError("speed other than 1.0 needs PyAV: pip install 'voxroom[opus]'")
    return _Tempo(av, speed, inner)
