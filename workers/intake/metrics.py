"""The worker's own Prometheus metrics, served by its ``/metrics`` (workers/intake/metrics_http.py).

Before, a worker had no port: it wrote its figures into its heartbeat hash and every gateway
re-exported them, so a cluster-wide scrape counted each worker once per gateway, and where a
line's time to first audio went existed only as a log line. Now each worker process exports:

- **Events**, updated once per utterance by :func:`observe_utterance` (the same place the log
  line is written): time to first audio and its four stages as histograms, utterances and
  published audio seconds as counters, labelled by ``engine`` and ``source`` (``engine`` or
  ``cache``).
- **State**, read at scrape time by :class:`WorkerCollector` from the live worker (per context:
  queue, active, load, real-time factor, synthesized audio and synthesis time; the pool's free
  places; the audio cache's counters): the synthesis hot path never touches a metric object.
- The supervisor's ``voxroom_loop_up`` / ``voxroom_loop_restarts`` (``process="worker"``) and the
  process collector (memory, CPU, file descriptors).

No ``worker`` label: Prometheus's own ``instance`` label tells workers apart, and
``voxroom_worker_info`` joins an instance to the worker id that Redis and the logs use.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from voxroom.runtime import metrics as shared

if TYPE_CHECKING:
    from workers.intake.worker import Worker
    from workers.output.publisher import PublishResult
    from workers.utterance import Utterance

STAGE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5,
                 2.0, 3.0, 5.0, 10.0)
"""1 ms to 10 s: a cache hit's stages take a millisecond, ChatTTS's first chunk on a CPU seconds."""

STAGES = ("read", "to_engine", "engine_first_chunk", "to_published")
"""The parts of the time to first audio, in order (:func:`stage_seconds`)."""

# Created without a registry: each served registry (:func:`worker_registry`) registers them, so a
# process that never serves metrics (in-process tests) registers nothing anywhere.
TIME_TO_FIRST_AUDIO = Histogram(
    "voxroom_worker_time_to_first_audio_seconds",
    "From the gateway accepting a say to this worker publishing its first audio slice.",
    ["engine", "source"], buckets=STAGE_BUCKETS, registry=None)
FIRST_AUDIO_STAGE = Histogram(
    "voxroom_worker_first_audio_stage_seconds",
    "One part of the time to first audio: read (gateway accept to this worker's read), to_engine "
    "(context queue, cache lookup, hand-off), engine_first_chunk (the engine's own first chunk), "
    "to_published (first chunk to first slice published).",
    ["stage", "engine", "source"], buckets=STAGE_BUCKETS, registry=None)
UTTERANCES = Counter("voxroom_worker_utterances", "Utterances this worker finished publishing, by status.",
                     ["engine", "source", "status"], registry=None)
AUDIO_SECONDS = Counter("voxroom_worker_audio_seconds", "Seconds of audio this worker published.",
                        ["engine", "source"], registry=None)

_EVENTS = (TIME_TO_FIRST_AUDIO, FIRST_AUDIO_STAGE, UTTERANCES, AUDIO_SECONDS)


def stage_seconds(utt: Utterance, first_slice_ms: float | None) -> dict[str, float | None]:
    """Where ``utt``'s time to first audio went, in seconds (``None``: a stage it never reached).
    ``total`` and ``read`` are against the gateway's whole-millisecond stamp; the others are this
    process's clock. The engine's first chunk is an interval the context measures itself."""
    job, started, chunk = utt.job, utt.synth_started_ms, utt.engine_first_chunk_ms

    def sec(ms: float | None) -> float | None:
        return ms / 1000.0 if ms is not None else None

    return {
        "total": sec(first_slice_ms - job.time_ms if first_slice_ms else None),
        "read": sec(utt.read_ms - job.time_ms if utt.read_ms else None),
        "to_engine": sec(started - utt.read_ms if started and utt.read_ms else None),
        "engine_first_chunk": sec(chunk),
        "to_published": sec(first_slice_ms - started - chunk if first_slice_ms and started and chunk is not None
                            else None),
    }


def observe_utterance(engine: str, utt: Utterance, result: PublishResult,
                      stages: dict[str, float | None]) -> None:
    """Count one published utterance and, when it reached its first slice, its stages."""
    source = utt.source or "none"
    UTTERANCES.labels(engine, source, result.status).inc()
    AUDIO_SECONDS.labels(engine, source).inc(result.duration_ms / 1000.0)
    total = stages["total"]
    if total is None:
        return  # failed or skipped before any audio: nothing reached a listener
    # Clamped at 0: "read" and "total" compare two hosts' clocks, which may disagree a little.
    TIME_TO_FIRST_AUDIO.labels(engine, source).observe(max(0.0, total))
    for stage in STAGES:
        value = stages[stage]
        if value is not None:
            FIRST_AUDIO_STAGE.labels(stage, engine, source).observe(max(0.0, value))


_CACHE_COUNTERS = {  # CacheStats attribute -> (metric, help); hit rate = hits / (hits + misses)
    "hits": ("voxroom_cache_hits", "Utterances published from the audio cache (LRU or Redis)."),
    "lru_hits": ("voxroom_cache_lru_hits", "Cache hits answered by the worker's in-process LRU."),
    "misses": ("voxroom_cache_misses", "Utterances looked up in the audio cache and synthesized."),
    "errors": ("voxroom_cache_errors", "Audio cache lookups or stores that failed on Redis."),
    "stores": ("voxroom_cache_stores", "Utterances written to the audio cache."),
    "bytes_served": ("voxroom_cache_served_bytes", "PCM bytes published from the audio cache."),
    "bytes_stored": ("voxroom_cache_stored_bytes", "PCM bytes written to the audio cache."),
    "dropped_stores": ("voxroom_cache_dropped_stores", "Cache stores given up because the store queue was full."),
}


class WorkerCollector:
    """Yields the worker's state at scrape time. Collected on the worker's event loop (the
    server is an asyncio one), so it reads the pool as the loop sees it, without locks."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    def describe(self) -> list[Metric]:
        return []  # families depend on the live worker; an empty describe keeps registration lazy

    def collect(self) -> Iterator[Metric]:
        w = self.worker
        info = GaugeMetricFamily("voxroom_worker_info", "1, labelled with this worker's id and engines.",
                                 labels=["worker", "engines"])
        info.add_metric([w.id, ",".join(sorted(w.pool.engine_names()))], 1.0)
        yield info
        yield GaugeMetricFamily("voxroom_worker_load", "Utterances queued or in flight on this worker.",
                                value=w.pool.load())
        yield GaugeMetricFamily("voxroom_worker_free", "Free places in this worker's context pool.",
                                value=w.pool.free())
        yield CounterMetricFamily("voxroom_worker_published", "Utterances this worker published (any status).",
                                  value=w.published)
        yield CounterMetricFamily("voxroom_worker_dropped",
                                  "Utterances given up because another worker owns them now.", value=w.dropped)
        labels = ["context", "device", "engines"]
        queue = GaugeMetricFamily("voxroom_context_queue", "Utterances waiting in one context's queue.",
                                  labels=labels)
        active = GaugeMetricFamily("voxroom_context_active",
                                   "Utterances between start of synthesis and end of publishing.", labels=labels)
        load = GaugeMetricFamily("voxroom_context_load", "Utterances queued or in flight on one context.",
                                 labels=labels)
        rtf = GaugeMetricFamily("voxroom_context_rtf", "Synthesis time / audio time of one context since it "
                                "started (rate() of the two counters gives it over a window).", labels=labels)
        audio = CounterMetricFamily("voxroom_context_audio_seconds", "Seconds of audio one context synthesized.",
                                    labels=labels)
        synth = CounterMetricFamily("voxroom_context_synthesis_seconds",
                                    "Seconds one context spent synthesizing.", labels=labels)
        for ctx in w.pool.contexts:
            values = [ctx.name, ctx.device, ",".join(sorted(ctx.engines))]
            queue.add_metric(values, ctx.queue.qsize())
            active.add_metric(values, ctx.active)
            load.add_metric(values, ctx.load)
            rtf.add_metric(values, ctx.synth_seconds / ctx.audio_seconds if ctx.audio_seconds else 0.0)
            audio.add_metric(values, ctx.audio_seconds)
            synth.add_metric(values, ctx.synth_seconds)
        yield from (queue, active, load, rtf, audio, synth)
        if w.cache is not None:
            stats = w.cache.stats
            for attr, (name, doc) in _CACHE_COUNTERS.items():
                yield CounterMetricFamily(name, doc, value=getattr(stats, attr))


def worker_registry(worker: Worker) -> CollectorRegistry:
    """What ``worker``'s ``/metrics`` serves: its events, its state, its loops, its process."""
    registry = CollectorRegistry()
    ProcessCollector(registry=registry)
    for metric in (*_EVENTS, shared.LOOP_UP, shared.LOOP_RESTARTS):
        registry.register(metric)
    registry.register(WorkerCollector(worker))
    return registry
