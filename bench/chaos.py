"""Faults while rooms speak: what the listeners heard, counted.

    .venv/bin/python bench/chaos.py [--rooms 20] [--duration 150] [--claim-ms 3000] [--aof-mb 64]

Starts its own redis-server (append-only, fsync always, so that a restart loses nothing Redis
acknowledged), two workers (offline voices: espeak-ng lines of about two seconds) and two gateways,
all real processes on loopback. Each room has two listeners, one of which speaks: it says its next
line when its previous one ended, resending the same ``seq`` whenever a line was not accepted
(``unavailable``, ``busy``, a dropped socket: the room's dedupe makes that safe). A listener whose
socket drops reconnects to the other gateway, saying what it holds (``?resume=``).

While they speak, at fixed moments: SIGKILL a worker (it comes back after a second, as under a
process supervisor), SIGKILL a gateway (back after a second; its listeners resume on the other),
SIGSTOP a worker for 10 s (longer than the claim time: another worker takes its lines over) then
SIGCONT, restart Redis from its AOF (SIGKILL, then start on the same files: the AOF holds
``--aof-mb`` of ballast so that it answers ``-LOADING`` for a while), and Redis out of memory for
3 s (``maxmemory`` below what it uses). Then the speakers stop and every accepted line gets 40 s
to finish.

Printed: lines accepted; per (listener, line): delivered whole (the last take is every slice
0..n-1 and an ``ok`` end), lost (no end, or not ok), duplicated (a slice twice within a take, or a
second ``end``), out of order (an entry of a line after a later line's, or slices out of sequence
within a take), frames after ``end``; and, per fault, the recovery time: the longest silence a room
had across the fault (from the fault, or from the room's last slice before the fault ended, to its
first slice after), worst room.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import websockets

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]

from tests.support.processes import Proc, start_gateway, start_worker  # noqa: E402
from voxroom.store import clients as redis_client  # noqa: E402
from voxroom.store.server import RedisServer  # noqa: E402
from voxroom.wire.protocol import AudioFrame  # noqa: E402

VOICE = "en-espeak"
WORDS = ("wolves", "village", "baker", "moon", "seer", "witch", "hunter", "night", "dawn", "vote")


@dataclass
class Heard:
    """One listener's record of the room, across reconnects, in arrival order."""

    events: list[tuple[str, int, int, float]] = field(default_factory=list)
    """(kind, utterance, chunk or chunks, wall time); kind: start, restart, frame, end, endfail."""
    position: str | None = None
    """What it holds, as ``?resume=`` says it: ``U.C``, ``U.start`` or ``U.end``."""
    reconnects: int = 0


class Listener:
    def __init__(self, ports: list[int], room: str, index: int, *, speaker: bool) -> None:
        self.ports = ports
        self.room = room
        self.gateway = index % len(ports)
        self.client_id = f"chaos-{room}-{index}"
        self.speaker = speaker
        self.heard = Heard()
        self.ws: Any = None
        self.accepted: dict[int, int] = {}
        """client seq -> room utterance."""
        self.answers: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.connected = asyncio.Event()
        self.stopping = False
        self.claim: str | None = None

    def url(self) -> str:
        query = f"client={self.client_id}"
        if self.heard.position is not None:
            query += f"&resume={self.heard.position}"
        if self.claim is not None:  # takes our id back at once from a gateway that died holding it
            query += f"&claim={self.claim}"
        return f"ws://127.0.0.1:{self.ports[self.gateway]}/rooms/{self.room}/ws?{query}"

    async def run(self) -> None:
        while not self.stopping:
            try:
                async with websockets.connect(self.url(), max_size=2**20, open_timeout=5) as ws:
                    self.ws = ws
                    self.connected.set()
                    async for message in ws:
                        self._on(message)
            except (OSError, websockets.WebSocketException, TimeoutError):
                pass
            self.connected.clear()
            self.ws = None
            for future in self.answers.values():
                if not future.done():
                    future.set_result({"type": "error", "code": "disconnected"})
            if self.stopping:
                return
            self.heard.reconnects += 1
            self.gateway = (self.gateway + 1) % len(self.ports)
            await asyncio.sleep(0.2)

    def _on(self, message: str | bytes) -> None:
        now = time.monotonic()
        events = self.heard.events
        if isinstance(message, bytes):
            frame = AudioFrame.decode(message)
            events.append(("frame", frame.seq, frame.chunk, now))
            self.heard.position = f"{frame.seq}.{frame.chunk}"
            return
        msg = json.loads(message)
        kind = msg.get("type")
        if kind == "welcome":
            self.claim = msg.get("claim")
        elif kind == "start":
            events.append(("restart" if msg.get("restart") else "start", msg["utterance"], 0, now))
            self.heard.position = f"{msg['utterance']}.start"
        elif kind == "end":
            events.append(("end" if msg.get("status") == "ok" else "endfail", msg["utterance"], msg["chunks"], now))
            self.heard.position = f"{msg['utterance']}.end"
        elif kind in ("accepted", "error") and msg.get("seq") in self.answers:
            future = self.answers.pop(msg["seq"])
            if not future.done():
                future.set_result(msg)
            if kind == "accepted":
                self.accepted[msg["seq"]] = msg["utterance"]

    async def speak(self, until: float) -> None:
        """Say a line, wait for it to end here, say the next; resend a line until it is accepted."""
        seq = 0
        while time.monotonic() < until:
            seq += 1
            text = f"Line {seq}: the {random.choice(WORDS)} and the {random.choice(WORDS)} wait."
            while seq not in self.accepted and time.monotonic() < until:
                await self.connected.wait()
                future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
                self.answers[seq] = future
                with contextlib.suppress(Exception):
                    await self.ws.send(json.dumps({"type": "say", "seq": seq, "text": text, "voice": VOICE}))
                try:
                    answer = await asyncio.wait_for(future, 5)
                except TimeoutError:
                    answer = {"type": "error", "code": "timeout"}
                if answer["type"] != "accepted":
                    await asyncio.sleep(max(0.3, answer.get("retry_after_ms", 300) / 1000))
            utterance = self.accepted.get(seq)
            while utterance is not None and time.monotonic() < until and not any(  # noqa: ASYNC110
                    e[0] in ("end", "endfail") and e[1] == utterance for e in self.heard.events):
                await asyncio.sleep(0.1)
            await asyncio.sleep(random.uniform(0.1, 0.5))


@dataclass
class Tally:
    pairs: int = 0
    whole: int = 0
    lost: int = 0
    duplicated: int = 0
    out_of_order: int = 0
    after_end: int = 0


def judge(heard: Heard, accepted: set[int], tally: Tally) -> None:
    """Count what one listener heard of each accepted line (see the module docstring)."""
    takes: dict[int, list[list[int]]] = {}
    ends: dict[int, list[tuple[str, int]]] = {}
    highest = 0
    disordered: set[int] = set()
    for kind, utt, value, _t in heard.events:
        if utt < highest:
            disordered.add(utt)
        highest = max(highest, utt)
        if kind in ("end", "endfail"):
            ends.setdefault(utt, []).append((kind, value))
            continue
        if utt in ends:  # anything of a line after its end
            tally.after_end += 1
        if kind == "restart" or (kind == "start" and utt not in takes):
            takes.setdefault(utt, []).append([])
        elif kind == "frame":
            takes.setdefault(utt, [[]])[-1].append(value)
    for utt in sorted(accepted):
        tally.pairs += 1
        got_ends = ends.get(utt, [])
        if len(got_ends) > 1:
            tally.duplicated += 1
        take = takes.get(utt, [[]])[-1]
        if len(take) != len(set(take)):
            tally.duplicated += 1
        if take != sorted(take) or utt in disordered:
            tally.out_of_order += 1
        if not got_ends or got_ends[0][0] != "end":
            tally.lost += 1
        elif take == list(range(got_ends[0][1])):
            tally.whole += 1


@dataclass
class Fault:
    name: str
    began_at: float
    ended_at: float = 0.0
    recovery_s: float | None = None


def recovery(fault: Fault, listeners: list[Listener]) -> float | None:
    """From the moment the fault began until the worst room heard a slice again after the fault
    ended (for a 10 s pause at least 10 s; a room the fault did not touch counts as soon as its
    audio goes on)."""
    worst = 0.0
    for listener in listeners:
        after = [t for kind, _u, _c, t in listener.heard.events if kind == "frame" and t >= fault.ended_at]
        if not after:
            return None
        # A room that kept playing through the fault has a slice right after its end.
        silent_from = max([t for kind, _u, _c, t in listener.heard.events
                           if kind == "frame" and t < fault.ended_at] + [fault.began_at])
        worst = max(worst, after[0] - max(fault.began_at, silent_from))
    return worst


class Cluster:
    def __init__(self, logs: Path, claim_ms: int, redis: RedisServer) -> None:
        self.logs = logs
        self.redis = redis
        self.env = {"VOXROOM_CLAIM_IDLE_MS": str(claim_ms), "VOXROOM_CACHE_SLOTS": "0"}
        self.workers: list[Proc] = [start_worker(redis.url, logs, name=f"worker{i}", **self.env) for i in range(2)]
        self.gateways: list[Proc] = []
        self.ports: list[int] = []
        for _ in range(2):
            proc, port = start_gateway(redis.url, logs, **self.env)
            self.gateways.append(proc)
            self.ports.append(port)

    async def kill_worker(self, i: int) -> None:
        self.workers[i].kill()
        await asyncio.sleep(1.0)
        self.workers[i] = await asyncio.to_thread(start_worker, self.redis.url, self.logs, name=f"worker{i}",
                                                  **self.env)

    async def kill_gateway(self, i: int) -> None:
        self.gateways[i].kill()
        await asyncio.sleep(1.0)
        proc, _ = await asyncio.to_thread(start_gateway, self.redis.url, self.logs, port=self.ports[i], **self.env)
        self.gateways[i] = proc

    async def pause_worker(self, i: int, seconds: float) -> None:
        os.killpg(self.workers[i].pid, signal.SIGSTOP)
        await asyncio.sleep(seconds)
        os.killpg(self.workers[i].pid, signal.SIGCONT)

    async def restart_redis(self) -> None:
        self.redis.kill()
        await asyncio.to_thread(self.redis.start, 60.0)

    async def out_of_memory(self, seconds: float) -> None:
        admin = redis_client.from_url(self.redis.url, decode_responses=True)
        try:
            used = int((await admin.info("memory"))["used_memory"])
            await admin.config_set("maxmemory-policy", "noeviction")
            await admin.config_set("maxmemory", max(1, used - 1_000_000))
            await asyncio.sleep(seconds)
            await admin.config_set("maxmemory", 0)
        finally:
            await admin.aclose()

    def stop(self) -> None:
        for proc in self.gateways + self.workers:
            proc.stop()


async def ballast(url: str, megabytes: int) -> None:
    admin = redis_client.from_url(url, decode_responses=False)
    try:
        blob = os.urandom(1 << 20)
        for i in range(megabytes):
            await admin.set(f"vx:bench:ballast:{i}", blob)
    finally:
        await admin.aclose()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rooms", type=int, default=20)
    parser.add_argument("--duration", type=float, default=150.0, help="seconds of speaking, faults included")
    parser.add_argument("--claim-ms", type=int, default=3000)
    parser.add_argument("--aof-mb", type=int, default=64, help="ballast in the AOF, so a restart LOADs a while")
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="voxroom-chaos-"))
    redis = RedisServer(data_dir=str(logs), persist=True, fsync="always").start()
    await ballast(redis.url, args.aof_mb)
    cluster = Cluster(logs, args.claim_ms, redis)
    listeners: list[Listener] = []
    for r in range(args.rooms):
        room = f"chaos-{r}"
        listeners += [Listener(cluster.ports, room, 0, speaker=True), Listener(cluster.ports, room, 1, speaker=False)]
    readers = [asyncio.create_task(listener.run(), name=f"chaos:{listener.client_id}") for listener in listeners]
    await asyncio.wait_for(asyncio.gather(*(listener.connected.wait() for listener in listeners)), 30)
    start = time.monotonic()
    until = start + args.duration
    speakers = [asyncio.create_task(listener.speak(until)) for listener in listeners if listener.speaker]
    step = args.duration / 6
    plan: list[tuple[str, Any]] = [
        ("SIGKILL worker", lambda: cluster.kill_worker(0)),
        ("SIGKILL gateway", lambda: cluster.kill_gateway(0)),
        ("SIGSTOP worker 10 s", lambda: cluster.pause_worker(1, 10.0)),
        ("Redis restart from AOF", cluster.restart_redis),
        ("Redis OOM 3 s", lambda: cluster.out_of_memory(3.0)),
    ]
    faults: list[Fault] = []
    try:
        for n, (name, action) in enumerate(plan, start=1):
            await asyncio.sleep(max(0.0, start + n * step - time.monotonic()))
            print(f"{time.monotonic() - start:6.1f} s  {name}", flush=True)
            began = time.monotonic()
            await action()
            faults.append(Fault(name, began, ended_at=time.monotonic()))
        await asyncio.gather(*speakers)
        drain_until = time.monotonic() + 40
        while time.monotonic() < drain_until:
            pending = [lst for lst in listeners if not all(
                any(e[0] in ("end", "endfail") and e[1] == u for e in lst.heard.events)
                for u in speakers_accepted(listeners, lst.room))]
            if not pending:
                break
            await asyncio.sleep(0.5)
    finally:
        for listener in listeners:
            listener.stopping = True
            if listener.ws is not None:
                with contextlib.suppress(Exception):
                    await listener.ws.close()
        for task in readers:
            task.cancel()
        await asyncio.gather(*readers, return_exceptions=True)
        cluster.stop()
        redis.stop()
    tally = Tally()
    accepted_total = 0
    for listener in listeners:
        accepted = speakers_accepted(listeners, listener.room)
        if listener.speaker:
            accepted_total += len(accepted)
        judge(listener.heard, accepted, tally)
    for fault in faults:
        fault.recovery_s = recovery(fault, listeners)
    print(f"\n{args.rooms} rooms x 2 listeners, {args.duration:.0f} s, claim {args.claim_ms} ms, "
          f"{sum(lst.heard.reconnects for lst in listeners)} reconnects; logs in {logs}\n")
    print("| lines accepted | (listener, line) pairs | delivered whole | lost | duplicated | out of order "
          "| frames after end |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {accepted_total} | {tally.pairs} | {tally.whole} | {tally.lost} | {tally.duplicated} | "
          f"{tally.out_of_order} | {tally.after_end} |")
    print("\n| fault | fault lasted, s | recovery: longest silence of a room across it, s |")
    print("|---|---|---|")
    for fault in faults:
        shown = f"{fault.recovery_s:.2f}" if fault.recovery_s is not None else "never"
        print(f"| {fault.name} | {fault.ended_at - fault.began_at:.1f} | {shown} |")


def speakers_accepted(listeners: list[Listener], room: str) -> set[int]:
    return {u for lst in listeners if lst.room == room and lst.speaker for u in lst.accepted.values()}


if __name__ == "__main__":
    asyncio.run(main())
