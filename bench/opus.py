"""Opus for room audio: bytes per second saved against PCM16, and the CPU it costs.

    .venv/bin/python bench/opus.py [--runs 20]

Audio: real speech from the offline espeak-ng voices (English and Mandarin lines), resliced into
40 ms room slices exactly as workers publish them. For each bit rate: wire bytes per second of
audio (32-byte frame header + room id + payload, what a listener receives), encoder CPU per
40 ms slice (what a worker spends per room, once, whatever the number of listeners), the share of
one core that is per real-time stream, the cost of a fresh encoder (one per utterance) and of
decoding (what a Python client would spend).
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from voxroom.voices.catalog import Voice
from voxroom.wire.protocol import AUDIO_HEADER_BYTES, ROOM_RATE, SLICE_MS
from workers.engines.base import SynthesisRequest
from workers.engines.espeak import EspeakEngine
from workers.output.opus import OpusDecoder, OpusEncoder
from workers.output.slicer import Slicer

LINES = [("en-us", "Good evening, villagers. Tonight the werewolves will choose their victim, and the seer "
                   "will open her eyes to learn one secret."),
         ("cmn", "天黑请闭眼，狼人请睁眼。请选择你们今晚要杀的人。预言家请睁眼，你要查验谁的身份？")]
ROOM_ID_BYTES = 12  # a typical room id


def speech_slices() -> list[np.ndarray]:
    engine = EspeakEngine()
    engine.load("cpu")
    slices: list[np.ndarray] = []
    for voice, text in LINES:
        slicer = Slicer(engine.sample_rate)
        request = SynthesisRequest(text=text, voice=Voice("b", "espeak", "eng", params={"voice": voice}))
        for pcm in engine.stream(request, threading.Event()):
            slices += slicer.push(pcm)
        slices += slicer.flush()
    return slices


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    slices = speech_slices()
    seconds = len(slices) * SLICE_MS / 1000
    overhead = AUDIO_HEADER_BYTES + ROOM_ID_BYTES
    pcm_rate = (sum(s.nbytes for s in slices) + overhead * len(slices)) / seconds
    print(f"{seconds:.1f} s of speech, {len(slices)} slices of {SLICE_MS} ms at {ROOM_RATE} Hz, {args.runs} runs\n")
    print("| codec | wire bytes/s | kbit/s | saved vs PCM16 | encode us/slice p50 | p95 | core share per stream "
          "| new encoder us | decode us/slice p50 |")
    print("|---|---|---|---|---|---|---|---|---|")
    print(f"| pcm16 | {pcm_rate:,.0f} | {pcm_rate * 8 / 1000:.0f} | - | - | - | - | - | - |")
    for bitrate in (16_000, 24_000, 32_000):
        encode_us: list[float] = []
        create_us: list[float] = []
        decode_us: list[float] = []
        wire = 0
        for run in range(args.runs):
            t0 = time.perf_counter()
            encoder = OpusEncoder(bitrate=bitrate)
            create_us.append((time.perf_counter() - t0) * 1e6)
            payloads = []
            for i, piece in enumerate(slices):
                t0 = time.perf_counter()
                payload = encoder.encode(piece)
                if i == len(slices) - 1:
                    payload += encoder.flush()
                encode_us.append((time.perf_counter() - t0) * 1e6)
                payloads.append(payload)
            if run == 0:
                wire = sum(len(p) + overhead for p in payloads)
                decoder = OpusDecoder()
                for payload in payloads:
                    t0 = time.perf_counter()
                    decoder.decode(payload)
                    decode_us.append((time.perf_counter() - t0) * 1e6)
        rate = wire / seconds
        p50 = float(np.percentile(encode_us, 50))
        print(f"| opus {bitrate // 1000} kb/s | {rate:,.0f} | {rate * 8 / 1000:.1f} | {1 - rate / pcm_rate:.1%} "
              f"| {p50:.0f} | {np.percentile(encode_us, 95):.0f} | {p50 / (SLICE_MS * 1000):.2%} "
              f"| {np.median(create_us):.0f} | {np.median(decode_us):.0f} |", flush=True)


if __name__ == "__main__":
    main()
