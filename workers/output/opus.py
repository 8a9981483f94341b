"""Opus payloads for audio frames: 20 ms Opus packets at the room rate, two per 40 ms frame.

An :class:`~voxroom.wire.protocol.AudioFrame` with ``codec == CODEC_OPUS`` keeps the PCM frame's header
(same room, seq, chunk, pts, ``samples``); only its payload differs. The payload is a sequence of
Opus packets, each prefixed by its length as a big-endian unsigned 16-bit integer::

    [len u16][packet] [len u16][packet] ...

A 40 ms slice carries two 20 ms packets; the last slice of an utterance may carry one more (the
encoder's tail, flushed so that the end of the utterance is not cut). Every utterance is its own
Opus stream (a fresh encoder per utterance), so a client decodes each utterance with a fresh
decoder and cached audio replays byte for byte. The decoded stream starts with the encoder's
look-ahead (:data:`PRE_SKIP_SAMPLES`, 6.5 ms) before the slice's first sample.

Packing and unpacking are pure; the codec itself (PyAV with its bundled libopus, the ``opus``
extra) is imported only when an encoder or decoder is made.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from typing import Any, Final

import numpy as np
import numpy.typing as npt

from voxroom.wire.protocol import ROOM_RATE

PACKET_MS: Final = 20
PACKET_SAMPLES: Final = ROOM_RATE * PACKET_MS // 1000
DEFAULT_BITRATE: Final = 24_000
"""Wide-band speech at 24 kb/s: 3 kB/s against PCM16's 48 kB/s."""
PRE_SKIP_SAMPLES: Final = 156
"""libopus look-ahead at 24 kHz (2.5 ms + 4 ms): decoded audio lags the PCM by this much."""
OPUS_RATES: Final = (8_000, 12_000, 16_000, 24_000, 48_000)
_LEN = struct.Struct(">H")


def pack_packets(packets: Iterable[bytes]) -> bytes:
    """Length-prefix and concatenate packets. Raises ``ValueError`` for a packet over 65535 bytes."""
    out = bytearray()
    for packet in packets:
        if len(packet) > 0xFFFF:
            raise ValueError(f"opus packet of {len(packet)} bytes is too long")
        out += _LEN.pack(len(packet))
        out += packet
    return bytes(out)


def unpack_packets(payload: bytes) -> list[bytes]:
    """The packets of an Opus frame payload. Raises ``ValueError`` when it is truncated."""
    packets = []
    pos = 0
    while pos < len(payload):
        if pos + 2 > len(payload):
            raise ValueError("opus payload truncated inside a length prefix")
        (size,) = _LEN.unpack_from(payload, pos)
        pos += 2
        if pos + size > len(payload):
            raise ValueError("opus payload truncated inside a packet")
        packets.append(payload[pos:pos + size])
        pos += size
    return packets


def _av() -> Any:
    try:
        import av
    except ImportError as exc:  # the light core has no PyAV
        raise RuntimeError("Opus needs PyAV: pip install 'voxroom[opus]'") from exc
    return av


class OpusEncoder:
    """One utterance's Opus stream. Feed int16 mono slices at ``sample_rate``; get frame payloads.

    Not thread-safe: one utterance belongs to one task. Encoding a 40 ms slice costs about 0.3 ms
    of CPU (see docs/benchmarks.md), so it may run on the worker's event loop.
    """

    def __init__(self, *, sample_rate: int = ROOM_RATE, bitrate: int = DEFAULT_BITRATE) -> None:
        if sample_rate not in OPUS_RATES:
            raise ValueError(f"Opus cannot encode at {sample_rate} Hz; it takes {OPUS_RATES}")
        av = _av()
        self._av = av
        ctx = av.CodecContext.create("libopus", "w")
        ctx.sample_rate = sample_rate
        ctx.layout = "mono"
        ctx.format = "s16"
        ctx.bit_rate = bitrate
        # voip: tuned for speech intelligibility; 20 ms packets as WebRTC and WebCodecs expect.
        ctx.options = {"application": "voip", "frame_duration": str(PACKET_MS)}
        ctx.open()
        self._ctx = ctx
        self._rate = sample_rate
        self._pts = 0

    def encode(self, pcm: npt.NDArray[np.int16]) -> bytes:
        """The payload for one slice (its complete 20 ms packets)."""
        frame = self._av.AudioFrame.from_ndarray(np.ascontiguousarray(pcm, dtype=np.int16).reshape(1, -1),
                                                 format="s16", layout="mono")
        frame.sample_rate = self._rate
        frame.pts = self._pts
        self._pts += int(pcm.size)
        return pack_packets(bytes(p) for p in self._ctx.encode(frame))

    def flush(self) -> bytes:
        """The encoder's remaining packets (end of the utterance), packed; may be empty."""
        return pack_packets(bytes(p) for p in self._ctx.encode(None))


class OpusDecoder:
    """Decode Opus frame payloads back to int16 mono at ``sample_rate`` (tests, Python clients)."""

    def __init__(self, *, sample_rate: int = ROOM_RATE) -> None:
        av = _av()
        self._av = av
        self._ctx = av.CodecContext.create("libopus", "r")
        self._ctx.sample_rate = sample_rate
        self._ctx.layout = "mono"
        # libopus decodes at 48 kHz whatever it is asked; resample to what the caller wants.
        self._resampler = av.AudioResampler(format="s16", layout="mono", rate=sample_rate)

    def decode(self, payload: bytes) -> npt.NDArray[np.int16]:
        parts: list[npt.NDArray[np.int16]] = []
        for packet in unpack_packets(payload):
            for frame in self._ctx.decode(self._av.Packet(packet)):
                for out in self._resampler.resample(frame):
                    parts.append(out.to_ndarray().reshape(-1).astype(np.int16))
        return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int16)
