"""Server-added latency: `say` sent -> first audio frame received, minus the engine's own time to
first chunk for the same text, measured in-process in the same run.

    .venv/bin/python bench/latency.py [--rounds 20] [--rooms 1,10,100]

Starts its own redis-server, one worker and one gateway (real processes, loopback). Two engines:
espeak-ng (a real voice whose first chunk takes about a millisecond, so what remains is the
server) and the synthetic benchmark engine: a fixed time to first chunk, it sleeps instead of
computing and serves a precomputed waveform, so it costs no CPU (it stands for a GPU). It gets one
context per room, so that 100 rooms measure the server, not queueing for a CPU voice. (A first
version computed its waveform per request: 100 of those at once measured numpy under the GIL.)
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.support.processes import start_gateway, start_worker
from tests.support.room_client import RoomClient
from voxroom.redis_server import RedisServer
from voxroom.voices import Catalog
from workers.engines.base import SynthesisRequest
from workers.engines.registry import create_engine

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


async def one_round(port: int, rooms: int, round_no: int, clients: list[RoomClient],
                    line_tag: str = "") -> list[float]:
    sent: list[float] = []
    for i, client in enumerate(clients):
        sent.append(time.time() * 1000)
        # Never the same line twice in one run (``line_tag`` differs per configuration): a repeat
        # would be served from the audio cache, not synthesized.
        await client.say(f"{TEXT} {line_tag}{round_no}-{i}", voice=VOICE)
    await asyncio.gather(*(c.wait_for(lambda g, n=round_no: len(g.ends()) >= n, 30) for c in clients))
    # ``end`` arrives before the audio finishes playing; a `say` sent before the room is quiet is
    # scheduled after it (gapless), which would count the room's own playback as latency. Wait
    # until every room's audio has played (its start pts + duration), on the same clock.
    plays_until = max(c.got.of("start")[-1]["pts_ms"] + c.got.ends()[-1]["duration_ms"] for c in clients)
    await asyncio.sleep(max(0.0, plays_until - time.time() * 1000) / 1000 + 0.05)
    out = []
    for t_sent, client in zip(sent, clients, strict=True):
        idx = next(i for i, f in enumerate(client.got.frames) if f.seq == round_no and f.chunk == 0)
        out.append(client.got.frame_times[idx] - t_sent)
    return out


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


async def measure(port: int, rooms: int, rounds: int, tag: str, line_tag: str) -> list[float]:
    clients = [RoomClient(port, f"bench-{tag}-{rooms}-{i}") for i in range(rooms)]
    for c in clients:
        await c.__aenter__()
    try:
        samples: list[float] = []
        await one_round(port, rooms, 1, clients, line_tag)  # warm-up (connections, engine caches)
        for r in range(2, rounds + 2):
            samples += await one_round(port, rooms, r, clients, line_tag)
        return samples
    finally:
        for c in clients:
            await c.__aexit__(None, None, None)


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
    args = parser.parse_args()
    room_counts = [int(x) for x in args.rooms.split(",")]
    rows = []
    logs = tempfile.mkdtemp(prefix="vxbench-")  # kept: worker and gateway logs for a failed run
    with RedisServer() as redis:
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
                    # The client process drives every room's socket; on uvloop its own per-frame
                    # cost (it timestamps arrivals) is a third of asyncio's.
                    total = _run(measure(port, rooms, args.rounds, label, "abc"[configs.index(label)]))
                    added = [t - ttfc for t in total]
                    rows.append((label, rooms, len(total), ttfc, pct(total, 50), pct(added, 50), pct(added, 95),
                                 pct(added, 99)))
            finally:
                gateway.stop()
                worker.stop()
    print(f"\nserver-added latency (say -> first audio frame, minus engine time to first chunk); "
          f"{args.rounds} rounds per row\n")
    print("| engine | rooms at once | samples | engine TTFC ms | total p50 ms | added p50 ms | added p95 ms "
          "| added p99 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for e, r, n, ttfc, tot, p50, p95, p99 in rows:
        print(f"| {e} | {r} | {n} | {ttfc:.1f} | {tot:.1f} | {p50:.2f} | {p95:.2f} | {p99:.2f} |")


if __name__ == "__main__":
    main()
