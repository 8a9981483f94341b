"""Prometheus metric definitions: what the gateway's ``/metrics`` exports.

Two kinds of figures:

- **Events the gateway sees** (time to first audio, errors by code, refused connections) are
  ordinary counters and histograms updated where they happen, with one-line calls.
- **State** (connections, rooms, per-client queues, slices sent and dropped, the job queue, and
  how many workers this gateway sees alive) is read at scrape time by :class:`GatewayCollector`
  from a :class:`GatewaySnapshot`, so the fan-out hot path never touches a metric object.

Workers serve their own ``/metrics`` (workers/intake/metrics.py): their time to first audio by stage,
contexts, cache and loops. A gateway no longer re-exports them from heartbeats (with N gateways a
cluster-wide scrape counted every worker N times); it exports only what it knows itself, such as
``voxroom_workers_alive``, the live heartbeats its ``/readyz`` counts. The heartbeat hash
(``vx:worker:{id}``, :func:`context_fields`) still carries the figures, for ``voxroom rooms``.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

REGISTRY = CollectorRegistry()
"""The gateway's own registry (not the library's global one, so imports never double-register)."""
ProcessCollector(registry=REGISTRY)

TTFA_BUCKETS = (0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)

TIME_TO_FIRST_AUDIO = Histogram(
    "voxroom_time_to_first_audio_seconds",
    "From a say accepted by this gateway to the first audio slice of that utterance reaching this gateway.",
    buckets=TTFA_BUCKETS, registry=REGISTRY)
UTTERANCES_ACCEPTED = Counter("voxroom_utterances_accepted", "say messages accepted by this gateway.",
                              registry=REGISTRY)
ERRORS = Counter("voxroom_errors", "error messages sent to clients, by protocol error code.", ["code"],
                 registry=REGISTRY)
CONNECTIONS_REFUSED = Counter("voxroom_connections_refused",
                              "WebSockets closed at once, by close code (1008 policy, 1012 draining, 1013 full).",
                              ["code"], registry=REGISTRY)
HANDSHAKES_REFUSED = Counter("voxroom_handshakes_refused",
                             "Connections closed before their request reached the app (app/room/handshake.py): "
                             "headers_timeout, uri_too_long (414), headers_too_large (431), bad_request (400).",
                             ["reason"], registry=REGISTRY)

REDIS_CUTOFFS = Counter("voxroom_redis_cutoffs",
                        "Times this gateway could not read Redis at all for a second or more (a partition, "
                        "Redis down): app/fanout/cutoff.py.", registry=REGISTRY)
REDIS_CUTOFF_SECONDS = Histogram("voxroom_redis_cutoff_seconds",
                                 "How long each cut-off from Redis lasted, from its first failed read to the "
                                 "first read back.", buckets=(1, 2, 5, 10, 20, 30, 60, 120, 300, 600),
                                 registry=REGISTRY)
REDIS_CUTOFF_RESYNCED = Counter("voxroom_redis_cutoff_resynced",
                                "Live listeners replayed what they missed, at their own pace, after a cut-off "
                                "from Redis (instead of a burst into their bounded queues).", registry=REGISTRY)
LOOP_UP = Gauge("voxroom_loop_up", "1 while a supervised background loop runs, 0 between its failure and restart "
                "(voxroom/runtime/supervisor.py).", ["process", "loop"], registry=REGISTRY)
LOOP_RESTARTS = Counter("voxroom_loop_restarts", "Restarts of a supervised background loop after it failed.",
                        ["process", "loop"], registry=REGISTRY)


class FirstAudioTimer:
    """Pairs ``accepted`` with the utterance's ``start`` entry arriving back from its room stream.

    Bounded (``limit`` entries, the oldest forgotten first) because an utterance may never start:
    its worker died, or every client of the room left this gateway before it played.
    """

    def __init__(self, histogram: Histogram, limit: int = 4096) -> None:
        self.histogram = histogram
        self.limit = limit
        self._accepted: OrderedDict[tuple[str, int], float] = OrderedDict()

    def accepted(self, room: str, utterance: int) -> None:
        UTTERANCES_ACCEPTED.inc()
        self._accepted[(room, utterance)] = time.monotonic()
        if len(self._accepted) > self.limit:
            self._accepted.popitem(last=False)

    def started(self, room: str, utterance: int) -> None:
        t0 = self._accepted.pop((room, utterance), None)
        if t0 is not None:
            self.histogram.observe(time.monotonic() - t0)


FIRST_AUDIO = FirstAudioTimer(TIME_TO_FIRST_AUDIO)


@dataclass
class SliceTotals:
    """Audio slices of clients that already left; live clients are summed at scrape time."""

    sent: int = 0
    dropped: int = 0

    def client_closed(self, sent: int, dropped: int) -> None:
        self.sent += sent
        self.dropped += dropped


CLOSED_CLIENTS = SliceTotals()


# -- worker side: what a worker puts in its heartbeat ----------------------------------------------


class ContextFigures(Protocol):
    """What :func:`context_fields` reads from a worker's synthesis context."""

    name: str
    device: str
    synth_seconds: float
    audio_seconds: float
    active: int

    @property
    def load(self) -> int: ...


def context_fields(contexts: Iterable[ContextFigures]) -> dict[str, str]:
    """Per-context heartbeat fields ``ctx.{name}.{figure}``; a context name never contains a dot."""
    out: dict[str, str] = {}
    for ctx in contexts:
        rtf = ctx.synth_seconds / ctx.audio_seconds if ctx.audio_seconds else 0.0
        out[f"ctx.{ctx.name}.rtf"] = f"{rtf:.4f}"
        out[f"ctx.{ctx.name}.load"] = str(ctx.load)
        out[f"ctx.{ctx.name}.active"] = str(ctx.active)
        out[f"ctx.{ctx.name}.audio_s"] = f"{ctx.audio_seconds:.1f}"
        out[f"ctx.{ctx.name}.device"] = ctx.device
    return out


# -- gateway side: the scrape-time collector ------------------------------------------------------


@dataclass
class GatewaySnapshot:
    gateway: str
    connections: int = 0
    rooms: int = 0
    slices_sent: int = 0
    slices_dropped: int = 0
    client_queue_total: int = 0
    client_queue_max: int = 0
    redis_up: bool = True
    jobs_length: int | None = None
    jobs_pending: int | None = None
    jobs_lag: int | None = None
    workers: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


class GatewayCollector:
    """Yields state metrics from the latest :class:`GatewaySnapshot` (set just before a scrape)."""

    def __init__(self) -> None:
        self.snapshot: GatewaySnapshot | None = None

    def describe(self) -> list[Metric]:
        return []  # families depend on the snapshot; an empty describe keeps registration lazy

    def collect(self) -> Iterator[Metric]:
        s = self.snapshot
        if s is None:
            return
        gw = ["gateway"]

        def gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
            g = GaugeMetricFamily(name, doc, labels=gw)
            g.add_metric([s.gateway], value)
            return g

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            c = CounterMetricFamily(name, doc, labels=gw)
            c.add_metric([s.gateway], value)
            return c

        yield gauge("voxroom_connections", "Open room WebSockets on this gateway.", s.connections)
        yield gauge("voxroom_rooms_active", "Rooms with at least one client on this gateway.", s.rooms)
        yield counter("voxroom_slices_sent", "Audio slices written to client sockets.", s.slices_sent)
        yield counter("voxroom_slices_dropped",
                      "Audio slices dropped from full client queues (slow listeners).", s.slices_dropped)
        yield gauge("voxroom_client_queue_frames", "Frames waiting in all client send queues.",
                    s.client_queue_total)
        yield gauge("voxroom_client_queue_frames_max", "Deepest client send queue, in frames.",
                    s.client_queue_max)
        yield gauge("voxroom_redis_up", "1 when the last scrape reached Redis.", 1.0 if s.redis_up else 0.0)
        if s.jobs_length is not None:
            yield gauge("voxroom_jobs_stream_length",
                        "Entries in the vx:jobs stream, or in all job shards on a cluster (XLEN).", s.jobs_length)
        if s.jobs_pending is not None:
            yield gauge("voxroom_jobs_pending", "Utterances read by a worker and not yet acked (XPENDING).",
                        s.jobs_pending)
        if s.jobs_lag is not None:
            yield gauge("voxroom_jobs_lag", "Utterances no worker has read yet (XINFO GROUPS lag).", s.jobs_lag)
        yield gauge("voxroom_workers_alive", "Workers whose heartbeat this gateway sees alive in Redis "
                    "(what /readyz counts; each worker's own figures are on its own /metrics).", len(s.workers))


COLLECTOR = GatewayCollector()
REGISTRY.register(COLLECTOR)
