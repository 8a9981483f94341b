"""Pure pieces of the operations tooling, fed values: the playout-buffer model, the heartbeat
re-export, the inspection tables."""

from __future__ import annotations

from prometheus_client.exposition import generate_latest
from prometheus_client.registry import CollectorRegistry

from locustfiles.playout import underruns
from voxroom.runtime import metrics
from voxroom_cli import rooms


def test_steady_slices_never_underrun() -> None:
    assert underruns([40.0 * i for i in range(50)]) == []
    assert underruns([0.0, 0.0, 0.0, 110.0, 150.0]) == []  # three in at once: slice 3 is due at 120 ms
    assert underruns([]) == []


def test_a_late_slice_is_one_stall_then_the_buffer_refills() -> None:
    arrivals = [40.0 * i for i in range(10)]
    arrivals[5:] = [a + 300.0 for a in arrivals[5:]]  # slices 5.. arrive 300 ms late
    # Playback starts when slice 2 is in (80 ms), so slice 5 is due at 80 + 5 x 40 = 280 ms; it
    # arrives at 500. The player waits for three slices again (slice 7 at 580 ms): a 300 ms stall,
    # then everything is on time.
    assert underruns(arrivals) == [300.0]


def test_the_gateway_counts_live_workers_and_re_exports_none_of_their_figures() -> None:
    heartbeat = {"engines": "chattts,espeak", "load": "3", "free": "5", "rtf": "0.210", "published": "42",
                 "time_ms": "1000", "ctx.cuda:0#0.rtf": "0.2000", "ctx.cuda:0#0.load": "2",
                 "ctx.cuda:0#0.active": "1", "ctx.cuda:0#0.device": "cuda:0", "cache.hits": "7"}
    collector = metrics.GatewayCollector()
    collector.snapshot = metrics.GatewaySnapshot(gateway="gw1", connections=7,
                                                 workers={"w1": heartbeat, "w2": {}}, jobs_lag=None)
    registry = CollectorRegistry()
    registry.register(collector)
    text = generate_latest(registry).decode()
    assert 'voxroom_workers_alive{gateway="gw1"} 2.0' in text
    # Each worker serves its own figures (workers/intake/metrics.py); a gateway re-exporting them made a
    # cluster-wide scrape count every worker once per gateway.
    assert "voxroom_worker_" not in text and "voxroom_context_" not in text and "voxroom_cache_" not in text
    assert 'voxroom_connections{gateway="gw1"} 7.0' in text
    assert "voxroom_jobs_lag" not in text  # unknown (Redis 6) is absent, not zero


def test_context_fields_round_trip() -> None:
    class Ctx:
        name, device, synth_seconds, audio_seconds, active, load = "cpu#0", "cpu", 1.0, 4.0, 1, 2

    fields = metrics.context_fields([Ctx()])
    assert fields["ctx.cpu#0.rtf"] == "0.2500" and fields["ctx.cpu#0.device"] == "cpu"


def test_table_is_aligned_and_truncates_long_cells() -> None:
    out = rooms.table(["a", "long header"], [["x" * 60, 1.25], ["y", float("nan")]]).splitlines()
    assert out[0].index("long header") == out[2].index("1.2")
    assert out[2].startswith("x" * 45 + "...")
    assert out[3].split()[-1] == "-"
