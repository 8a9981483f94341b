"""Server-added latency: `say` sent -> first audio frame received, minus the engine's own time to
first chunk for the same text, measured in-process in the same run.

    .venv/bin/python bench/latency.py [--rounds 20] [--rooms 1,10,100] [--clients lean,websockets]

Starts its own redis-server, one worker and one gateway (real processes, loopback). Two engines:
espeak-ng (a real voice whose first chunk takes about a millisecond, so what remains is the
server) and the synthetic benchmark engine: a fixed time to first chunk, it sleeps instead of
computing and serves a precomputed waveform, so it costs no CPU (it stands for a GPU). It gets one
context per room, so that 100 rooms measure the server, not queueing for a CPU voice. (A first
version computed its waveform per request: 100 of those at once measured numpy under the GIL.)

"Rooms at once": every room's client sends its line in the same loop turn, then the round waits
until every room's audio has played. The rooms' clients live in this process: by default the lean
client of bench/_wsclient.py (four header fields read per frame); ``--clients websockets`` runs
the tests' client (the websockets library) in the same run, to show what the load generator adds.
A second table gives each process's CPU time per line. bench/floor.py measures the same hops with
nothing else on them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, Protocol

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _wsclient import Listener, connect  # noqa: E402

from tests.support.processes import start_gateway, start_worker  # noqa: E402
from tests.support.room_client import RoomClient  # noqa: E402
from voxroom.store.server import RedisServer  # noqa: E402
from voxroom.voices.catalog import Catalog  # noqa: E402
from workers.engines.base import SynthesisRequest  # noqa: E402
from workers.engines.registry import create_engine  # noqa: E402

TEXT = "The werewolves wake up."


def engine_ttfc_ms(engine_name: str, voice_id: str, runs: int, **options: float) -> float:
    """Median in-process time to the engine's first chunk for TEXT."""
    engine = create_engine(engine_name, **options)
    engine.load("cpu")
    voice = Catalog.load().get(voice_id)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        for _chunk in engine.stream(SynthesisRequest(TEXT, voice), threading.Event()):
            times.append((time.perf_counter() - start) * 1000)
            break
    engine.close()
    return statistics.median(times)


class Speaker(Listener):
    """A lean room client (bench/_wsclient.py): it sends ``say`` frames and notes when each
    utterance's first slice arrives, reading four header fields instead of decoding the frame.
    The bench measures the server; on two cores the load generator's own per-frame cost (the
    websockets library's reader task, frame objects) competes with it for the same CPU."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.first_audio: dict[int, float] = {}
        self.starts: dict[int, float] = {}
        self.durations: dict[int, float] = {}
        self.errors: list[dict[str, Any]] = []
        self.changed = asyncio.Event()

    def audio_frame(self, buf: bytearray, head: int) -> None:
        seq, chunk = SEQ_CHUNK.unpack_from(buf, head + 12)
        if chunk == 0 and seq not in self.first_audio:
            self.first_audio[seq] = time.time() * 1000

    def text_frame(self, data: bytes) -> None:
        msg = json.loads(data)
        kind = msg.get("type")
        if kind == "start":
            self.starts[msg["utterance"]] = msg["pts_ms"]
        elif kind == "end":
            self.durations[msg["utterance"]] = msg["duration_ms"]
            self.changed.set()
        elif kind == "error":
            self.errors.append(msg)
            self.changed.set()


SEQ_CHUNK = struct.Struct(">II")  # bytes 12..19 of the audio header (voxroom.wire.protocol.AudioFrame)


class Room(Protocol):
    """What a round needs of a room's client, whichever client it is."""

    async def say_line(self, text: str, round_no: int) -> None: ...
    async def wait_end(self, round_no: int, timeout: float) -> None: ...
    def played_until(self, round_no: int) -> float: ...
    def first_audio_ms(self, round_no: int) -> float: ...
    async def close(self) -> None: ...


class LeanRoom:
    def __init__(self, speaker: Speaker) -> None:
        self.s = speaker

    async def say_line(self, text: str, round_no: int) -> None:
        self.s.send_text(json.dumps({"type": "say", "seq": round_no, "text": text, "voice": VOICE}))

    async def wait_end(self, round_no: int, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while round_no not in self.s.durations:
                if self.s.errors:
                    raise RuntimeError(f"the server refused a line: {self.s.errors[-1]}")
                self.s.changed.clear()
                await self.s.changed.wait()

    def played_until(self, round_no: int) -> float:
        return self.s.starts[round_no] + self.s.durations[round_no]

    def first_audio_ms(self, round_no: int) -> float:
        return self.s.first_audio[round_no]

    async def close(self) -> None:
        self.s.close()


class LibraryRoom:
    """The websockets library client the tests use (tests/support/room_client.py)."""

    def __init__(self, client: RoomClient) -> None:
        self.c = client

    async def say_line(self, text: str, round_no: int) -> None:
        await self.c.say(text, voice=VOICE, seq=round_no)

    async def wait_end(self, round_no: int, timeout: float) -> None:
        await self.c.wait_for(lambda g: len(g.ends()) >= round_no, timeout)

    def played_until(self, round_no: int) -> float:
        return float(self.c.got.of("start")[-1]["pts_ms"] + self.c.got.ends()[-1]["duration_ms"])

    def first_audio_ms(self, round_no: int) -> float:
        got = self.c.got
        idx = next(i for i, f in enumerate(got.frames) if f.seq == round_no and f.chunk == 0)
        return got.frame_times[idx]

    async def close(self) -> None:
        await self.c.__aexit__(None, None, None)


async def open_room(port: int, room: str, client: str) -> Room:
    if client == "lean":
        speaker = await connect("127.0.0.1", port, f"/rooms/{room}/ws", kind=Speaker)
        assert isinstance(speaker, Speaker)
        return LeanRoom(speaker)
    library = RoomClient(port, room)
    await library.__aenter__()
    return LibraryRoom(library)


async def one_round(rooms: list[Room], round_no: int, line_tag: str = "", spread_ms: float = 0.0) -> list[float]:
    """Every room says one line: all in one loop turn (a burst), or each at its own moment,
    uniformly within ``spread_ms`` (the same moments for a round number in every run)."""
    sent = [0.0] * len(rooms)

    async def speak(i: int, room: Room, delay_s: float) -> None:
        if delay_s:
            await asyncio.sleep(delay_s)
        sent[i] = time.time() * 1000
        # Never the same line twice in one run (``line_tag`` differs per configuration): a repeat
        # would be served from the audio cache, not synthesized.
        await room.say_line(f"{TEXT} {line_tag}{round_no}-{i}", round_no)

    if spread_ms > 0:
        moments = random.Random(round_no)
        await asyncio.gather(*(speak(i, room, moments.uniform(0, spread_ms) / 1000)
                               for i, room in enumerate(rooms)))
    else:
        for i, room in enumerate(rooms):
            await speak(i, room, 0.0)
    await asyncio.gather(*(r.wait_end(round_no, 30) for r in rooms))
    # ``end`` arrives before the audio finishes playing; a `say` sent before the room is quiet is
    # scheduled after it (gapless), which would count the room's own playback as latency. Wait
    # until every room's audio has played (its start pts + duration), on the same clock.
    plays_until = max(r.played_until(round_no) for r in rooms)
    await asyncio.sleep(max(0.0, plays_until - time.time() * 1000) / 1000 + 0.05)
    return [r.first_audio_ms(round_no) - t_sent for t_sent, r in zip(sent, rooms, strict=True)]


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """User + system CPU time so far of each process (the client: this one, all threads)."""
    out = {}
    for name, pid in pids.items():
        times = psutil.Process(pid).cpu_times()
        out[name] = times.user + times.system
    return out


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def measure(port: int, rooms: int, rounds: int, tag: str, line_tag: str, client: str,
                  spread_ms: float) -> list[float]:
    clients = [await open_room(port, f"bench-{tag}-{client}-{rooms}-{i}", client) for i in range(rooms)]
    try:
        samples: list[float] = []
        await one_round(clients, 1, line_tag, spread_ms)  # warm-up (connections, engine caches)
        for r in range(2, rounds + 2):
            samples += await one_round(clients, r, line_tag, spread_ms)
        return samples
    finally:
        for c in clients:
            await c.close()


VOICE = "en-espeak"
SYNTHETIC = {"ttfc_ms": 50.0, "rtf": 0.05}


def _run(coro: Coroutine[Any, Any, list[float]]) -> list[float]:
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def main() -> None:
    global VOICE
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--rooms", default="1,10,100")
    parser.add_argument("--engines", default="espeak,synthetic,synthetic-batch",
                        help="which of espeak, synthetic, synthetic-batch to run")
    parser.add_argument("--spread-ms", type=float, default=0.0,
                        help="0: every room's line in one loop turn (a burst); N: each room at its own "
                             "moment within N ms (rooms active together, lines not synchronised)")
    parser.add_argument("--clients", default="lean",
                        help="lean (bench/_wsclient.py), websockets (the tests' library client), or both")
    args = parser.parse_args()
    room_counts = [int(x) for x in args.rooms.split(",")]
    rows = []
    cpu_rows: list[tuple[str, str, int, dict[str, float]]] = []
    logs = tempfile.mkdtemp(prefix="vxbench-")  # kept: worker and gateway logs for a failed run
    with RedisServer() as redis:
        assert redis.process is not None
        redis_pid = redis.process.pid
        most = max(room_counts)
        configs = ["espeak", "synthetic", "synthetic-batch"]
        for label, engine, contexts, max_rooms, options, env in (
            ("espeak", "espeak", 2, 10, {}, {}),
            # One context (thread) per room: 100 rooms are 100 devices.
            ("synthetic", "synthetic", most, most, SYNTHETIC, {}),
            # One context for every room, as one GPU serves them: rows join the running batch at
            # any moment (continuous batching), one thread wakes for all of them.
            ("synthetic-batch", "synthetic", 1, most, SYNTHETIC,
             {"VOXROOM_SYNTHETIC_MAX_BATCH": str(max(2, most)), "VOXROOM_SYNTHETIC_CONTINUOUS": "1",
              "VOXROOM_CONTEXT_INFLIGHT": str(max(2, most)), "VOXROOM_CONTEXT_QUEUE": str(max(4, most))}),
        ):
            if label not in args.engines.split(","):
                continue
            VOICE = "en-espeak"
            if engine == "synthetic":
                env = {**env, "VOXROOM_SYNTHETIC_TTFC_MS": str(options["ttfc_ms"]),
                       "VOXROOM_SYNTHETIC_RTF": str(options["rtf"])}
            worker = start_worker(redis.url, Path(logs), engine="offline" if engine == "espeak" else engine,
                                  contexts=contexts, **env)
            gateway, port = start_gateway(redis.url, Path(logs))
            try:
                ttfc = engine_ttfc_ms(engine, VOICE, 20, **options)
                for rooms in room_counts:
                    if rooms > max_rooms:
                        continue
                    for client in args.clients.split(","):
                        # The client process drives every room's socket; on uvloop its own
                        # per-frame cost (it timestamps arrivals) is a third of asyncio's.
                        tag = "abc"[configs.index(label)] + client[0]
                        procs = {"gateway": gateway.pid, "worker": worker.pid, "redis": redis_pid,
                                 "client": os.getpid()}
                        before = cpu_seconds(procs)
                        total = _run(measure(port, rooms, args.rounds, label, tag, client, args.spread_ms))
                        after = cpu_seconds(procs)
                        lines = rooms * (args.rounds + 1)  # with the warm-up round
                        cpu = {k: (after[k] - before[k]) * 1000 / lines for k in procs}
                        added = [t - ttfc for t in total]
                        rows.append((label, client, rooms, len(total), ttfc, pct(total, 50), pct(added, 50),
                                     pct(added, 95), pct(added, 99)))
                        cpu_rows.append((label, client, rooms, cpu))
            finally:
                gateway.stop()
                worker.stop()
    print(f"\nserver-added latency (say -> first audio frame, minus engine time to first chunk); "
          f"{args.rounds} rounds per row; lines of a round "
          f"{f'spread over {args.spread_ms:.0f} ms' if args.spread_ms else 'sent in one burst'}\n")
    print("| engine | client | rooms at once | samples | engine TTFC ms | total p50 ms | added p50 ms "
          "| added p95 ms | added p99 ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for e, c, r, n, ttfc, tot, p50, p95, p99 in rows:
        print(f"| {e} | {c} | {r} | {n} | {ttfc:.1f} | {tot:.1f} | {p50:.2f} | {p95:.2f} | {p99:.2f} |")
    print("\nCPU per line: each process's CPU time during the row over the lines sent (the whole utterance: "
          "intake, hand-off, every paced slice, fan-out; plus each process's idle upkeep, which is most of it "
          "at 1 room)\n")
    print("| engine | client | rooms at once | gateway | worker | redis | client | all |")
    print("|---|---|---|---|---|---|---|---|")
    for e, c, r, cpu in cpu_rows:
        print(f"| {e} | {c} | {r} | " + " | ".join(f"{cpu[k]:.2f}" for k in ("gateway", "worker", "redis", "client"))
              + f" | {sum(cpu.values()):.2f} |")


if __name__ == "__main__":
    main()
