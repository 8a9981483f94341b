"""One Redis instance against a 3-primary Redis Cluster, rooms speaking at once: Redis CPU per line.

    .venv/bin/python bench/cluster.py [--rooms 20] [--rounds 10] [--reps 1] [--idle-s 5]
        [--configs single,cluster] [--wait auto|on|off] [--cache on|off]   # about 5 minutes

docs/benchmarks.md ("Redis Cluster") ran it with ``--reps 2``.

Per configuration it starts its own Redis, one ``voxroom worker`` and one ``voxroom gateway`` (real
processes on loopback, started as bench/latency.py and bench/capacity.py start them; ``REDIS_URL``
names one node, all a process is given):

- ``single``: one redis-server (bench/latency.py's), no replica.
- ``single-replica``: the same plus one replica (``REPLICAOF``), so that the WAIT rows have a
  baseline that replicates too.
- ``cluster``: 3 primaries and 3 replicas of ``redis-server --cluster-enabled yes`` joined with
  ``redis-cli --cluster create --cluster-replicas 1`` (tests/cluster/conftest.py's).
- ``single-replica-wait``, ``cluster-wait``: the same with ``VOXROOM_REDIS_WAIT_REPLICAS=1`` (the
  gateway answers ``accepted`` once one replica has the line). ``--wait auto`` (default) adds them
  when voxroom/runtime/settings.py knows the setting, ``on`` requires it, ``off`` leaves them out.

The worker runs the synthetic benchmark engine on one continuously batched context (it sleeps
instead of computing: it stands for a GPU, so the CPU is the server's). The audio cache is on
(``--cache on``, the default deployment, on a cluster too): every line is a new text, so every
line is a lookup that misses and a store, as in bench/capacity.py. A round: every room's lean
client (bench/_wsclient.py through bench/latency.py's ``Speaker``) says one line in the same loop
turn, then the round waits until every room's audio has played (bench/latency.py ``one_round``),
so lines per second is the load offered (rooms / round length), not a ceiling. One warm-up round
is left out of every figure. CPU is each process's CPU time over the measured rounds
(``/proc/PID/task/*/schedstat``, bench/capacity.py ``cpu_s``), summed over every redis-server of
the configuration (primaries and replicas), over the lines spoken: "all" includes each process's
upkeep over the same wall time, "net" subtracts the rate of a silent window (``--idle-s``, every
room connected, bench/capacity.py ``window``) taken after the warm-up. Commands per line are the
primaries' ``INFO commandstats`` calls over the rounds (``WAIT`` among them: proof that the WAIT
rows wait). Time to first audio: ``say`` sent -> the line's first audio frame at the same client
(the engine's own 50 ms to first chunk included). Configurations run one after another; with
``--reps N`` the order alternates and the figures pool every repetition. The ratio table divides
each configuration by its baseline measured in the same run. A configuration that fails (a
refused line, a process that does not start) is reported with its processes' log tails; the
others go on.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from _wsclient import percentiles  # noqa: E402
from capacity import cpu_s, window  # noqa: E402
from latency import SYNTHETIC, Room, one_round, open_room  # noqa: E402

from tests.support.cluster import RedisClusterProcs  # noqa: E402
from tests.support.processes import Proc, start_gateway, start_worker  # noqa: E402
from voxroom.runtime.settings import Settings  # noqa: E402
from voxroom.store.server import RedisServer  # noqa: E402

WAIT_SETTING = "VOXROOM_REDIS_WAIT_REPLICAS"


@dataclass(frozen=True)
class Config:
    name: str
    cluster: bool
    replica: bool = False
    wait: bool = False
    baseline: str = ""
    """The configuration this one is divided by in the ratio table."""


CONFIGS = {c.name: c for c in (
    Config("single", cluster=False),
    Config("single-replica", cluster=False, replica=True, baseline="single"),
    Config("cluster", cluster=True, baseline="single"),
    Config("single-replica-wait", cluster=False, replica=True, wait=True, baseline="single-replica"),
    Config("cluster-wait", cluster=True, wait=True, baseline="cluster"),
)}


@dataclass
class Result:
    lines: int = 0
    wall_s: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    """CPU seconds over the measured rounds: gateway, worker, client, redis, of which replicas."""
    upkeep: dict[str, float] = field(default_factory=dict)
    """CPU seconds the same processes spend over the same wall time with every room silent."""
    redis_net_ms: list[float] = field(default_factory=list)
    """Redis CPU per line net of upkeep, one figure per repetition (the spread)."""
    calls: dict[str, int] = field(default_factory=dict)
    """Commands the primaries ran over the measured rounds, by name (``cmdstat_wait``...)."""
    ttfa_ms: list[float] = field(default_factory=list)
    failure: str = ""


def wait_supported() -> bool:
    return WAIT_SETTING in Settings.env_names()


# -- Redis ------------------------------------------------------------------------------------


@dataclass
class Nodes:
    url: str
    primaries: dict[int, int]
    """pid -> port"""
    replicas: list[int]


def commands(ports: list[int]) -> dict[str, int]:
    """Calls of each command so far, summed over ``ports`` (INFO commandstats; the INFO itself is one)."""
    out: dict[str, int] = {}
    for port in ports:
        with redis.Redis(port=port) as r:
            for name, stats in r.info("commandstats").items():
                out[name] = out.get(name, 0) + int(stats["calls"])
    return out


@contextlib.contextmanager
def redis_for(config: Config, tmp: Path) -> Iterator[Nodes]:
    """The configuration's Redis: its URL (one node), its primaries' pids and ports, its replicas' pids."""
    if config.cluster:
        cluster = RedisClusterProcs(tmp)
        try:
            cluster.start()
            primaries = {n.port for n in cluster.primaries()}
            for port in primaries:
                wait_replica_streams(port)
            yield Nodes(cluster.url, {n.process.pid: n.port for n in cluster.nodes if n.port in primaries},
                        [n.process.pid for n in cluster.nodes if n.port not in primaries])
        finally:
            cluster.stop()
        return
    with contextlib.ExitStack() as stack:
        primary = stack.enter_context(RedisServer())
        assert primary.process is not None
        if not config.replica:
            yield Nodes(primary.url, {primary.process.pid: primary.port}, [])
            return
        replica = stack.enter_context(RedisServer())
        assert replica.process is not None
        with redis.Redis(port=replica.port) as r:
            r.execute_command("REPLICAOF", "127.0.0.1", str(primary.port))
        wait_replica_streams(primary.port)
        yield Nodes(primary.url, {primary.process.pid: primary.port}, [replica.process.pid])


def wait_replica_streams(port: int, timeout: float = 30.0) -> None:
    """Until the primary on ``port`` has a write acknowledged by its replica. A link that says
    ``up`` may not stream yet: after a diskless sync a Redis 7.0 primary sends nothing until the
    replica's first ACK, up to a second later (docs/cluster.md); a fresh cluster's first lines with
    WAIT then answer ``unavailable``. The write goes to a key of one of this node's own slots (a
    cluster node answers ``MOVED`` for the others; with 3 primaries a third of the keys are its own)."""
    deadline = time.monotonic() + timeout
    with redis.Redis(port=port) as r:
        for i in range(10_000):
            key = f"vx:bench:replicated:{i}"
            with contextlib.suppress(redis.ResponseError):
                r.set(key, "1")
                break
        while r.execute_command("WAIT", 1, 500) < 1:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the replica of port {port} did not acknowledge a write in {timeout} s")
        r.delete(key)


# -- one configuration --------------------------------------------------------------------------


async def speak_rounds(port: int, args: argparse.Namespace, tag: str, pids: dict[str, int],
                       redis_ports: list[int], result: Result) -> None:
    rooms: list[Room] = []
    try:
        for i in range(args.rooms):
            rooms.append(await open_room(port, f"bench-cluster-{tag}-{i}", "lean"))
        await one_round(rooms, 1, tag)  # warm-up: connections, slot maps, the worker's first batch
        # Upkeep: every room connected and silent (blocked reads timing out, heartbeats, the
        # cluster bus); larger on a cluster, and paid whether lines are spoken or not.
        idle = await window(pids, args.idle_s)
        n0, c0, t0 = commands(redis_ports), cpu_s(pids), time.monotonic()
        for r in range(2, args.rounds + 2):
            result.ttfa_ms += await one_round(rooms, r, tag)
        c1, t1, n1 = cpu_s(pids), time.monotonic(), commands(redis_ports)
    finally:
        for room in rooms:
            await room.close()
    lines = args.rooms * args.rounds
    result.lines += lines
    result.wall_s += t1 - t0
    redis_net = 0.0
    for name in pids:
        key = name.split(":")[0]
        result.cpu[key] = result.cpu.get(key, 0.0) + c1[name] - c0[name]
        result.upkeep[key] = result.upkeep.get(key, 0.0) + idle[name] * (t1 - t0)
        if key == "redis":
            redis_net += c1[name] - c0[name] - idle[name] * (t1 - t0)
    result.redis_net_ms.append(redis_net * 1000 / lines)
    for name, calls in n1.items():
        result.calls[name] = result.calls.get(name, 0) + calls - n0.get(name, 0)


async def run_config(config: Config, args: argparse.Namespace, rep: int, result: Result, logs: Path) -> None:
    n = str(max(4, args.rooms))
    env = {"VOXROOM_SYNTHETIC_TTFC_MS": str(SYNTHETIC["ttfc_ms"]), "VOXROOM_SYNTHETIC_RTF": str(SYNTHETIC["rtf"]),
           "VOXROOM_SYNTHETIC_MAX_BATCH": n, "VOXROOM_SYNTHETIC_CONTINUOUS": "1",
           "VOXROOM_CONTEXT_INFLIGHT": n, "VOXROOM_CONTEXT_QUEUE": n}
    if args.cache == "off":
        env["VOXROOM_CACHE_SLOTS"] = "0"
    if config.wait:
        env[WAIT_SETTING] = "1"
    procs: list[Proc] = []
    try:
        with tempfile.TemporaryDirectory(prefix="vx-cluster-bench-") as tmp, \
                redis_for(config, Path(tmp)) as nodes:
            try:
                procs.append(start_worker(nodes.url, logs, engine="synthetic", contexts=1, name=f"worker-{config.name}",
                                          **env))
                # The worker logs at INFO: start_worker waits for its "ready:" line.
                gateway, port = start_gateway(nodes.url, logs, port=None, insecure=True,
                                              VOXROOM_LOG_LEVEL="WARNING", **env)
                procs.append(gateway)
                pids = {"gateway": gateway.pid, "worker": procs[0].pid, "client": os.getpid()}
                pids |= {f"redis:{pid}": pid for pid in [*nodes.primaries, *nodes.replicas]}
                pids |= {f"replicas:{pid}": pid for pid in nodes.replicas}
                await speak_rounds(port, args, f"{config.name}-r{rep}-", pids, list(nodes.primaries.values()), result)
            finally:
                for p in procs:
                    p.stop()
    except Exception as exc:  # reported with the processes' logs; the other configurations go on
        tails = "\n".join(f"--- {p.log_path} (exit {p.popen.returncode})\n"
                          f"{p.log_path.read_text(errors='replace')[-3000:]}" for p in procs)
        result.failure += f"rep {rep}: {type(exc).__name__}: {exc}\n{tails}\n"


# -- the tables --------------------------------------------------------------------------------


def per_line_ms(result: Result, key: str, net: bool = False) -> float:
    """CPU per line of ``key``'s processes; ``net``: less their silent upkeep over the same time."""
    if not result.lines:
        return float("nan")
    return (result.cpu.get(key, 0.0) - (result.upkeep.get(key, 0.0) if net else 0.0)) * 1000 / result.lines


def print_tables(results: dict[str, Result], args: argparse.Namespace, load_before: float) -> None:
    done = {name: r for name, r in results.items() if r.lines}
    print(f"\nmachine: {os.cpu_count()} cores, load average {load_before:.2f} before, "
          f"{os.getloadavg()[0]:.2f} after; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"{args.rooms} rooms at once, {args.rounds} rounds, {args.reps} repetition(s); "
          f"WAIT setting {'present' if wait_supported() else 'absent'} in voxroom/runtime/settings.py\n")
    print("| configuration | redis-server processes | lines | lines/s | first audio p50 ms | p95 ms | p99 ms "
          "| commands/line (primaries) | WAIT/line |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, r in done.items():
        c = CONFIGS[name]
        nodes = "3 + 3 replicas" if c.cluster else ("1 + 1 replica" if c.replica else "1")
        p50, p95, p99 = percentiles(r.ttfa_ms)
        print(f"| {name} | {nodes} | {r.lines} | {r.lines / r.wall_s:.1f} | {p50:.1f} | {p95:.1f} | {p99:.1f} "
              f"| {sum(r.calls.values()) / r.lines:.0f} | {r.calls.get('cmdstat_wait', 0) / r.lines:.2f} |")
    print(f"\nCPU per line (ms): all = each process's CPU time over the measured rounds / lines; net = less "
          f"its rate in a {args.idle_s:g} s silent window (same rooms connected) over the same time; "
          "upkeep = that silent rate, in cores\n")
    print("| configuration | Redis all | Redis net | of it replicas (all) | Redis net per rep | Redis upkeep "
          "| gateway all | gateway net | gateway upkeep | worker all | worker net | worker upkeep | client all |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name, r in done.items():
        cells = [f"{per_line_ms(r, 'redis'):.2f}", f"{per_line_ms(r, 'redis', True):.2f}",
                 f"{per_line_ms(r, 'replicas'):.2f}", " / ".join(f"{v:.2f}" for v in r.redis_net_ms),
                 f"{r.upkeep.get('redis', 0.0) / r.wall_s:.3f}"]
        for key in ("gateway", "worker"):
            cells += [f"{per_line_ms(r, key):.2f}", f"{per_line_ms(r, key, True):.2f}",
                      f"{r.upkeep.get(key, 0.0) / r.wall_s:.3f}"]
        print(f"| {name} | " + " | ".join(cells) + f" | {per_line_ms(r, 'client'):.2f} |")
    pairs = [(n, CONFIGS[n].baseline) for n in done if CONFIGS[n].baseline in done]
    if pairs:
        print("\nratios, measured in the same run (configuration / its baseline)\n")
        print("| ratio | Redis all | Redis net | gateway all | gateway net | worker all | worker net "
              "| first audio p50 | p95 | p99 |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name, base in pairs:
            a, b = done[name], done[base]
            cpu = " | ".join(f"{per_line_ms(a, k, net) / per_line_ms(b, k, net):.2f}"
                             for k in ("redis", "gateway", "worker") for net in (False, True))
            ttfa = " | ".join(f"{x / y:.2f}" for x, y in zip(percentiles(a.ttfa_ms), percentiles(b.ttfa_ms),
                                                              strict=True))
            print(f"| {name} / {base} | {cpu} | {ttfa} |")
    for name, r in results.items():
        if r.failure:
            print(f"\nFAILED: {name}\n{r.failure}")
    print(f"\ncommand: .venv/bin/python bench/cluster.py --rooms {args.rooms} --rounds {args.rounds} "
          f"--reps {args.reps} --configs {args.configs} --wait {args.wait} --idle-s {args.idle_s:g} "
          f"--cache {args.cache}")


async def run(args: argparse.Namespace) -> None:
    names = [n for n in args.configs.split(",") if n]
    unknown = [n for n in names if n not in CONFIGS]
    if unknown:
        raise SystemExit(f"unknown configuration(s) {unknown}; known: {', '.join(CONFIGS)}")
    if args.wait == "on" and not wait_supported():
        raise SystemExit(f"--wait on: voxroom/runtime/settings.py has no {WAIT_SETTING} yet")
    if args.wait == "off" or not wait_supported():
        dropped = [n for n in names if CONFIGS[n].wait]
        if dropped:
            print(f"left out {dropped}: {WAIT_SETTING} is " + ("turned off (--wait off)" if args.wait == "off"
                                                                 else "not in voxroom/runtime/settings.py yet"))
        names = [n for n in names if n not in dropped]
    else:
        # A WAIT row and its baseline: one replica for the single instance, the cluster has three.
        if any(not CONFIGS[n].cluster for n in names):
            names += ["single-replica", "single-replica-wait"]
        if "cluster" in names:
            names.append("cluster-wait")
        names = list(dict.fromkeys(names))
    load_before = os.getloadavg()[0]
    results = {n: Result() for n in names}
    logs = Path(tempfile.mkdtemp(prefix="vx-cluster-bench-logs-"))  # kept: the processes' logs of a failed run
    for rep in range(args.reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            print(f"rep {rep + 1}: {name}", flush=True)
            await run_config(CONFIGS[name], args, rep, results[name], logs)
    print(f"logs: {logs}")
    print_tables(results, args, load_before)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rooms", type=int, default=20, help="rooms speaking at once, one lean client each")
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds (one line per room each)")
    parser.add_argument("--reps", type=int, default=1, help="repetitions of every configuration, order alternating")
    parser.add_argument("--configs", default="single,cluster", help=f"any of {', '.join(CONFIGS)}")
    parser.add_argument("--cache", choices=("on", "off"), default="on",
                        help="the worker's audio cache (every line is new text: a miss and a store)")
    parser.add_argument("--idle-s", type=float, default=5.0, help="seconds of the silent window (upkeep)")
    parser.add_argument("--wait", choices=("auto", "on", "off"), default="auto",
                        help=f"add the {WAIT_SETTING}=1 rows: when the setting exists (auto), always, never")
    args = parser.parse_args()
    loop_factory: Callable[[], asyncio.AbstractEventLoop] | None = None
    with contextlib.suppress(ImportError):
        import uvloop  # the client process drives every room's socket: uvloop's per-frame cost is lower

        loop_factory = uvloop.new_event_loop
    with asyncio.Runner(loop_factory=loop_factory) as runner:
        runner.run(run(args))


if __name__ == "__main__":
    main()
