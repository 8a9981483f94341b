"""The audio cache against a real redis-server: keys, bounds, the LRU, and failures as misses."""

from __future__ import annotations

import uuid

import numpy as np
from redis.asyncio import Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from tests.support.stores import Stores
from voxroom.store import keys
from voxroom.voices.catalog import Voice
from voxroom.wire.protocol import SLICE_SAMPLES
from workers.audio_cache.cache import SLICE_BYTES, AudioCache, CachedLine, fingerprint, normalise_text, to_slices
from workers.engines.marks import WordMark

VOICE = Voice("v", "espeak", "eng", params={"voice": "en-us"})


def _pcm(slices: int, seed: int) -> bytes:
    rng = np.random.default_rng(seed)
    return rng.integers(-2000, 2000, slices * SLICE_SAMPLES, dtype=np.int16).astype("<i2").tobytes()


def _fp(text: str, **overrides: object) -> str:
    args: dict[str, object] = {"engine": "espeak", "model_version": "", "engine_rate": 22050, "voice": VOICE,
                               "text": text}
    args.update(overrides)
    return fingerprint(**args)  # type: ignore[arg-type]


def test_the_fingerprint_covers_what_changes_the_audio_and_ignores_what_does_not() -> None:
    base = _fp("The night falls.")
    assert _fp("  The   night\tfalls. ") == base  # whitespace is not heard
    assert _fp("The night falls?") != base  # punctuation is
    assert _fp("the night falls.") != base  # so is case (an engine may spell capitals)
    assert _fp("The night falls.", engine="piper") != base
    assert _fp("The night falls.", model_version="2") != base
    assert _fp("The night falls.", voice=Voice("v", "espeak", "eng", params={"voice": "en-us", "rate": 200})) != base
    other = Voice("w", "espeak", "eng", params={"voice": "en-gb"})
    assert _fp("The night falls.", previous_voice=other) != base  # a switch changes ChatTTS's audio
    assert _fp("The night falls.", previous_voice=VOICE) == base
    assert normalise_text("e\u0301 ") == "\u00e9"  # NFC


async def test_put_then_get_round_trips_and_the_lru_answers_without_redis(redis_url: str, stores: Stores) -> None:
    redis = Redis.from_url(redis_url)
    try:
        cache = AudioCache(*await stores.cache_pipes(redis), slots=64, lru_entries=4)
        fp = _fp(f"line {uuid.uuid4()}")
        assert await cache.get(fp) is None
        pcm = _pcm(5, 1)
        assert await cache.put(fp, pcm)
        assert await redis.ttl(cache.slot_key(fp)) > 0
        fresh = AudioCache(*await stores.cache_pipes(redis), slots=64, lru_entries=4)  # another worker: only Redis knows the line
        assert await fresh.get(fp) == CachedLine(pcm)
        assert await fresh.get(fp) == CachedLine(pcm)
        assert (fresh.stats.hits, fresh.stats.lru_hits, fresh.stats.misses) == (2, 1, 0)
        assert fresh.stats.bytes_served == 2 * len(pcm)
        assert b"".join(s.tobytes() for s in to_slices(pcm)) == pcm
        assert all(s.size == SLICE_SAMPLES for s in to_slices(pcm))
        assert cache.stats.misses == 1 and cache.stats.stores == 1 and cache.stats.hit_rate == 0.0
        # Word marks travel with the audio, through Redis, unchanged (times to the µs).
        marked = _fp(f"marked {uuid.uuid4()}")
        words = (WordMark("Night", 0, 5, 12.5, 301.25), WordMark("狼", 6, 1, 301.25, 520.0))
        assert await cache.put(marked, pcm, words)
        assert await AudioCache(*await stores.cache_pipes(redis), slots=64, lru_entries=0).get(marked) == CachedLine(pcm, words)
        assert set(fresh.stats.fields()) >= {"cache.hits", "cache.misses", "cache.bytes_served"}
    finally:
        await redis.aclose()


async def test_the_key_space_is_bounded_a_slot_holds_one_line_and_long_lines_are_not_cached(redis_url: str, stores: Stores) -> None:
    redis = Redis.from_url(redis_url)
    try:
        cache = AudioCache(*await stores.cache_pipes(redis), slots=1, entry_max_bytes=4 * SLICE_BYTES, lru_entries=0)
        first, second = _fp(f"a {uuid.uuid4()}"), _fp(f"b {uuid.uuid4()}")
        assert cache.slot_key(first) == cache.slot_key(second) == keys.cache_slot(0)
        assert await cache.put(first, _pcm(2, 2))
        assert await cache.put(second, _pcm(3, 3))
        assert await cache.get(first) is None  # evicted by the line that shared its slot
        assert await cache.get(second) == CachedLine(_pcm(3, 3))
        assert not await cache.put(first, _pcm(5, 4))  # over entry_max_bytes
        assert not await cache.put(first, b"\x00" * (SLICE_BYTES + 1))  # not whole slices
        assert cache.stats.too_large == 2
        assert await redis.hget(keys.cache_slot(0), "fp") == second.encode()
    finally:
        await redis.aclose()


async def test_an_unreachable_redis_is_a_miss_and_a_dropped_store(stores: Stores) -> None:
    # Nothing listens on port 1; no retries, so that the test takes no time.
    redis = Redis(host="127.0.0.1", port=1, socket_connect_timeout=0.2, retry=Retry(NoBackoff(), 0))
    try:
        cache = AudioCache(*await stores.cache_pipes(redis), slots=8, lru_entries=0)
        fp = _fp("anything")
        assert await cache.get(fp) is None
        assert not await cache.put(fp, _pcm(1, 5))
        assert cache.stats.errors == 2 and cache.stats.misses == 1
    finally:
        await redis.aclose()
