"""A Redis Cluster primary SIGKILLed while rooms on every primary speak (issue 32): the scenario
tests/cluster/test_cluster_failover.py asserts on and bench/failover.py times.

Two gateways and two workers (``--engine synthetic``), each seeded by a node that survives; two
rooms on each primary; per room a speaker on gateway A and a listener on gateway B. A speaker keeps
two ``say`` in flight, as the load clients and any game that queues lines do, and at most two
lines ahead of what its room plays; a line refused ``unavailable`` or ``busy`` is resent with the
same ``seq`` after the ``retry_after_ms`` it was given. Once every room has begun its third line,
one primary is SIGKILLed (``kill=False``: the no-fault control, same load), and every room says
its sixth line at once. The run ends when every listener heard every line it was promised.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from redis.cluster import RedisCluster

from tests.support.cluster import ClusterNode, RedisClusterProcs
from tests.support.processes import Proc, start_gateway, start_worker
from tests.support.room_client import Received, RoomClient
from voxroom.store import keys

VOICE = "en-joe"
ROOMS_PER_PRIMARY = 2
KILL_AT_LINE = 3


@dataclass
class RoomRun:
    room: str
    holder: int
    """Port of the primary holding the room's slot when the run began."""
    texts: list[str]
    """What the speaker said, by ``seq`` (``texts[seq - 1]``)."""
    speaker: Received
    listener: Received

    def replies(self, kind: str, code: str | None = None) -> list[dict[str, Any]]:
        return [m for m in self.speaker.of(kind) if code is None or m.get("code") == code]

    def frame_gaps_ms(self, since_ms: float = 0.0) -> list[tuple[float, float]]:
        """``(at_ms, gap_ms)``: the room's silences after ``since_ms`` (wall clock) as its listener
        heard them, each the time since the previous audio frame (or since ``since_ms``)."""
        times = [since_ms, *(t for t in self.listener.frame_times if t > since_ms)]
        return [(b, b - a) for a, b in zip(times, times[1:], strict=False)]

    def longest_silence_ms(self, since_ms: float = 0.0) -> float:
        return max((gap for _, gap in self.frame_gaps_ms(since_ms)), default=0.0)

    def first_frame_after_ms(self, at_ms: float) -> float | None:
        return next((t for t in self.listener.frame_times if t > at_ms), None)


@dataclass
class FailoverRun:
    rooms: list[RoomRun]
    victim: int | None
    """Port of the primary killed (``None``: the control)."""
    killed_ms: float | None = None
    promoted_ms: float | None = None
    """Wall clock when a surviving node first named a new primary for the victim's slots."""
    logs: dict[str, str] = field(default_factory=dict)

    def victims(self) -> list[RoomRun]:
        return [r for r in self.rooms if r.holder == self.victim]

    def survivors(self) -> list[RoomRun]:
        return [r for r in self.rooms if r.holder != self.victim]


def rooms_on_every_primary(cluster: RedisClusterProcs, per_primary: int) -> dict[str, int]:
    """Room -> port of the primary holding its slot, ``per_primary`` rooms on each primary."""
    primaries = {n.port for n in cluster.primaries()}
    tag = uuid.uuid4().hex[:6]
    holder: dict[str, int] = {}
    with RedisCluster.from_url(cluster.url, socket_timeout=5) as rc:
        routed: Any = rc  # redis-py's get_node_from_key is untyped
        counts = dict.fromkeys(primaries, 0)
        i = 0
        while any(c < per_primary for c in counts.values()):
            room = f"fo-{tag}-{i}"
            i += 1
            port = int(routed.get_node_from_key(keys.room_state(room)).port)
            if counts[port] < per_primary:
                counts[port] += 1
                holder[room] = port
    return holder


async def _say_until_stored(speaker: RoomClient, text: str, seq: int, timeout_s: float) -> dict[str, Any]:
    """``accepted`` or ``duplicate`` (both mean stored): resent with the same ``seq`` after
    ``unavailable`` or ``busy``."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while loop.time() < deadline:
        mark = len(speaker.got.messages)
        await speaker.say(text, voice=VOICE, seq=seq)

        def reply(got: Received, at: int = mark) -> dict[str, Any] | None:
            return next((m for m in got.messages[at:] if m.get("seq") == seq
                         and m.get("type") in ("accepted", "error")), None)

        await speaker.wait_for(lambda g: reply(g) is not None, 30)
        answer = reply(speaker.got)
        assert answer is not None
        if answer["type"] == "accepted" or answer["code"] == "duplicate":
            return answer
        assert answer["code"] in ("unavailable", "busy"), answer
        await asyncio.sleep(answer.get("retry_after_ms", 500) / 1000)
    raise TimeoutError(f"say {seq} never stored")


async def _speak(room: str, speaker: RoomClient, listener: RoomClient, texts: list[str],
                 killed: asyncio.Event) -> None:
    in_flight = asyncio.Semaphore(2)
    sends: list[asyncio.Task[dict[str, Any]]] = []

    async def one(seq: int) -> dict[str, Any]:
        try:
            return await _say_until_stored(speaker, texts[seq - 1], seq, timeout_s=90)
        finally:
            in_flight.release()

    for seq in range(1, len(texts) + 1):
        await in_flight.acquire()
        if seq == KILL_AT_LINE + 3:
            # Said right after the kill, whatever the room plays: a victim room's say meets the
            # dead primary (``unavailable``, resent), and the next line may be stored before it.
            await killed.wait()
        else:
            # At most two lines ahead of what the room plays: a line playing and one waiting when
            # the primary dies, not a long backlog that hides the silence.
            await listener.wait_for(lambda g, at=seq: len(g.of("start")) >= at - 2, 120)
        sends.append(asyncio.create_task(one(seq), name=f"test:say:{room}:{seq}"))
    await asyncio.gather(*sends)


def _node_id(node: ClusterNode) -> str:
    with node.client() as r:
        return str(r.execute_command("CLUSTER", "MYID").decode())


async def run_primary_kill(cluster: RedisClusterProcs, logs: Path, *, lines: int = 8, kill: bool = True,
                           per_primary: int = ROOMS_PER_PRIMARY) -> FailoverRun:
    holder = rooms_on_every_primary(cluster, per_primary)
    victim_port = next(iter(holder.values()))
    victim = next(n for n in cluster.nodes if n.port == victim_port)
    seeds = [n for n in cluster.nodes if n.port != victim_port]
    procs: list[Proc] = []
    run = FailoverRun([], victim_port if kill else None)
    try:
        gateways = []
        for node in seeds[:2]:
            proc, port = start_gateway(node.url, logs)
            procs.append(proc)
            gateways.append(port)
        procs += [start_worker(node.url, logs, engine="synthetic", name=f"worker-{i}")
                  for i, node in enumerate(seeds[2:4])]
        async with contextlib.AsyncExitStack() as stack:
            clients = {room: (await stack.enter_async_context(RoomClient(gateways[0], room)),
                              await stack.enter_async_context(RoomClient(gateways[1], room)))
                       for room in holder}
            texts = {room: [f"Line {n} in room {room}." for n in range(1, lines + 1)] for room in holder}
            run.rooms = [RoomRun(room, holder[room], texts[room], s.got, li.got) for room, (s, li) in clients.items()]

            killed = asyncio.Event()

            async def kill_when_speaking() -> None:
                await asyncio.gather(*(li.wait_for(lambda g: len(g.of("start")) >= KILL_AT_LINE, 120)
                                       for _, li in clients.values()))
                if not kill:
                    run.killed_ms = time.time() * 1000
                    killed.set()
                    return
                victim_id = _node_id(victim)
                os.killpg(victim.process.pid, signal.SIGKILL)
                victim.process.wait()
                run.killed_ms = time.time() * 1000
                killed.set()
                while not await asyncio.to_thread(_new_primary_named, seeds[0], victim_id):  # noqa: ASYNC110 (polls another process)
                    await asyncio.sleep(0.05)
                run.promoted_ms = time.time() * 1000

            killer = asyncio.create_task(kill_when_speaking(), name="test:kill")
            await asyncio.gather(*(_speak(room, s, li, texts[room], killed) for room, (s, li) in clients.items()))
            await killer
            for _, listener in clients.values():
                await listener.wait_ends(lines, timeout=120)
            await asyncio.sleep(0.5)  # anything sent twice arrives by now
        return run
    finally:
        for proc in procs:
            run.logs[str(proc.log_path.name)] = proc.log_text()
            proc.stop()


def _new_primary_named(survivor: ClusterNode, victim_id: str) -> bool:
    """The survivor's view: the victim holds no slot any more (its replica took them over)."""
    with survivor.client() as r:
        nodes = r.execute_command("CLUSTER", "NODES").decode().splitlines()
    return not any(line.startswith(victim_id) and len(line.split()) > 8 for line in nodes)
