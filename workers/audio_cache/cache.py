"""The audio cache: a repeated line is published from Redis instead of being synthesized again.

What is cached is exactly what the slicer produced for the utterance (int16 PCM at the room rate,
whole 40 ms slices, fades included), so a hit goes through the same publisher as fresh audio:
same framing, same pacing, same room order, and the Opus copy is encoded from the same samples.
The line's word marks (times from its first sample) are kept beside it, so a hit sends the same
captions as the synthesis did.

**Key.** A SHA-256 fingerprint of everything that determines the audio: the engine's name, model
version (``model_version`` when an engine has one) and rate; the voice's engine, language and
params (embeddings included); the voice a switch moves from when it differs, and the part of the
switch the line covers (ChatTTS steps from one voice to the other over a switch's lines); the room
rate and slice size; the line's own lexicon when it has one (``say``'s ``lexicon``); and the
text, normalised only in ways that no engine hears (Unicode NFC, runs of whitespace collapsed,
ends stripped).

**Bounds, independent of Redis's maxmemory.** The key space is fixed: an entry lives in slot
``fingerprint mod slots`` (``vx:cache:{slot}``, a hash holding the full fingerprint and the
PCM), so a new line overwrites whatever shared its slot (a direct-mapped cache). Entries longer
than ``entry_max_bytes`` are not cached. Redis therefore holds at most ``slots x
entry_max_bytes`` of cache (1024 x 480 kB = 469 MiB by default, about 150 MiB for 3-second
lines), and every entry expires ``ttl_s`` after it was last written. Two hot lines that share a
slot evict each other; the in-process LRU in front (``lru_entries`` per worker) keeps the hottest
ones out of that fight and saves the round trip.

**Calls.** Lookups and stores are one ``EVAL`` each on the entry's one key
(voxroom/store/lua/cache.py), through two of the store's pipelines: one shared by the lookups, one
for the stores. On a Redis Cluster each goes to the node of its key's slot. A slot key has no hash
tag, so Redis Cluster hashes the whole key (CRC16 of ``vx:cache:<n>``): the slots spread over every
primary, and each entry lies whole on one.

Redis failures never fail an utterance: a lookup that fails is a miss, a store that fails is
dropped, both counted.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import re
import unicodedata
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt
from redis.exceptions import RedisError

from voxroom.store import keys
from voxroom.store.interface import Commands
from voxroom.store.lua import cache as lua
from voxroom.voices.catalog import Voice
from voxroom.wire.protocol import ROOM_RATE, SLICE_SAMPLES
from workers.engines.marks import WordMark

log = logging.getLogger("voxroom.worker.cache")

FORMAT_VERSION = 2
"""Bump when what is stored changes (slicer fades, slice size...): old entries stop matching.
2: word marks stored beside the PCM."""
SLICE_BYTES = SLICE_SAMPLES * 2
_SPACES = re.compile(r"\s+")


def normalise_text(text: str) -> str:
    """What the cache keys on: NFC, whitespace runs collapsed to one space, ends stripped. Case and
    punctuation are kept: engines read them (a question mark changes the intonation)."""
    return _SPACES.sub(" ", unicodedata.normalize("NFC", text)).strip()


def fingerprint(*, engine: str, model_version: str, engine_rate: int, voice: Voice, text: str,
                previous_voice: Voice | None = None, switch_range: tuple[float, float] = (0.0, 1.0),
                lexicon: tuple[tuple[str, str], ...] = ()) -> str:
    """The hex SHA-256 of everything that determines the audio (see the module docstring).
    ``previous_voice``/``switch_range``: as in ``SynthesisRequest``; a line in the middle of a
    switch never shares an entry with the plain voice's line, nor with another part of the switch.
    ``lexicon``: the line's own respellings (``SynthesisRequest.lexicon``); a line with one never
    shares an entry with the same text without it, or with another. Lines without one keep the
    keys they had before lines could carry one."""
    def describe(v: Voice) -> dict[str, object]:
        return {"engine": v.engine, "language": v.language, "params": dict(v.params)}

    prev = previous_voice if previous_voice is not None and previous_voice.id != voice.id else None
    switch = {**describe(prev), "range": [float(x) for x in switch_range]} if prev is not None else None
    material = {"v": FORMAT_VERSION, "engine": engine, "model": model_version, "engine_rate": engine_rate,
                "room_rate": ROOM_RATE, "slice": SLICE_SAMPLES, "voice": describe(voice),
                "prev": switch, "text": normalise_text(text)}
    if lexicon:
        material["lexicon"] = sorted([key, value] for key, value in lexicon)
    blob = json.dumps(material, sort_keys=True, ensure_ascii=False, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class CachedLine(NamedTuple):
    """One line as the cache keeps it: its slices' PCM and its word marks."""

    pcm: bytes
    marks: tuple[WordMark, ...] = ()


def encode_marks(marks: Sequence[WordMark]) -> bytes:
    """Compact JSON, one ``[text, offset, length, start_ms, end_ms]`` per word."""
    rows = [[m.text, m.offset, m.length, round(m.start_ms, 3), round(m.end_ms, 3)] for m in marks]
    return json.dumps(rows, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def decode_marks(blob: object) -> tuple[WordMark, ...]:
    """:func:`encode_marks` back; anything else (absent, damaged by hand) is no marks, never an
    error: the audio is still right, only its captions are missing."""
    if not isinstance(blob, bytes) or not blob:
        return ()
    try:
        return tuple(WordMark(str(t), int(o), int(n), float(a), float(b)) for t, o, n, a, b in json.loads(blob))
    except (ValueError, TypeError):
        log.warning("audio cache entry with unreadable word marks; serving it without them")
        return ()


def to_slices(pcm: bytes) -> list[npt.NDArray[np.int16]]:
    """Cached bytes back into the slices the publisher takes."""
    audio = np.frombuffer(pcm, dtype="<i2").astype(np.int16)
    return [audio[i:i + SLICE_SAMPLES] for i in range(0, audio.size, SLICE_SAMPLES)]


@dataclass
class CacheStats:
    hits: int = 0
    """Lookups answered (LRU or Redis)."""
    lru_hits: int = 0
    misses: int = 0
    errors: int = 0
    stores: int = 0
    too_large: int = 0
    bytes_served: int = 0
    bytes_stored: int = 0
    dropped_stores: int = 0
    """Stores given up because ``store_queue`` stores were already waiting."""

    def fields(self) -> dict[str, str]:
        """Heartbeat fields (``cache.*``), re-exported by the gateways' ``/metrics``."""
        return {f"cache.{name}": str(value) for name, value in vars(self).items()}

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


class AudioCache:
    """Look up and store utterance audio. Event-loop only (no locks): the worker's contexts call it
    from their runner coroutines, never from their synthesis threads.

    ``lookups`` and ``writes``: two pipelines of the store (bytes replies: the PCM is binary),
    owned: closed by :meth:`aclose`. Many contexts look up at once when many rooms speak: their
    lookups share round trips; stores have a connection of their own, so a lookup never waits
    behind a store's 100 kB of PCM on the wire (as when stores were MULTIs on a pool).
    """

    def __init__(self, lookups: Commands, writes: Commands, *, slots: int = 1024, entry_max_bytes: int = 480_000,
                 ttl_s: int = 86_400, lru_entries: int = 64, store_queue: int = 256) -> None:
        if slots <= 0:
            raise ValueError("an audio cache needs at least one slot")
        self._lookups = lookups
        self._writes = writes
        self.slots = slots
        self.entry_max_bytes = entry_max_bytes
        self.ttl_s = ttl_s
        self.lru_entries = lru_entries
        self._lru: OrderedDict[str, CachedLine] = OrderedDict()
        self.store_queue = store_queue
        self._stores: deque[tuple[str, CachedLine]] = deque()
        self._store_ready = asyncio.Event()
        self.stats = CacheStats()

    def slot_key(self, fp: str) -> str:
        return keys.cache_slot(int(fp[:15], 16) % self.slots)

    async def get(self, fp: str) -> CachedLine | None:
        """The cached line for ``fp``, or ``None`` (a miss, or Redis unreachable)."""
        remembered = self._lru.get(fp)
        if remembered is not None:
            self._lru.move_to_end(fp)
            self.stats.lru_hits += 1
            return self._hit(remembered)
        stored: Any = None
        try:
            # The slot holds whichever line hashed there last: its PCM comes back only when the
            # fingerprint matches (a miss must not carry another line's 100 kB of audio).
            stored = await self._lookups.call("EVAL", lua.GET, 1, self.slot_key(fp), fp)
        except (RedisError, OSError) as exc:
            self.stats.errors += 1
            log.warning("audio cache lookup failed (%s); synthesizing", exc)
        pcm = stored[0] if isinstance(stored, list) and len(stored) == 2 else None
        if not isinstance(pcm, bytes) or not pcm or len(pcm) % SLICE_BYTES:
            self.stats.misses += 1
            return None
        line = CachedLine(pcm, decode_marks(stored[1]))
        self._remember(fp, line)
        return self._hit(line)

    def _hit(self, line: CachedLine) -> CachedLine:
        self.stats.hits += 1
        self.stats.bytes_served += len(line.pcm)
        return line

    async def put(self, fp: str, pcm: bytes, marks: Sequence[WordMark] = ()) -> bool:
        """Store an utterance's PCM (whole slices) and word marks. ``False`` when it is too long
        or Redis failed."""
        if len(pcm) > self.entry_max_bytes or not pcm or len(pcm) % SLICE_BYTES:
            self.stats.too_large += 1
            return False
        try:
            await self._writes.call("EVAL", lua.PUT, 1, self.slot_key(fp), fp, pcm, encode_marks(marks), ROOM_RATE,
                                    FORMAT_VERSION, self.ttl_s)
        except (RedisError, OSError) as exc:
            self.stats.errors += 1
            log.warning("audio cache store failed: %s", exc)
            return False
        self.stats.stores += 1
        self.stats.bytes_stored += len(pcm)
        self._remember(fp, CachedLine(pcm, tuple(marks)))
        return True

    def store_later(self, fp: str, line: CachedLine) -> bool:
        """Queue a store for :meth:`run_stores` and return at once. A store moves an utterance's
        whole PCM (about 100 kB for 2 s) through the loop and the Redis connection; done inline,
        100 rooms' stores landed in the same few milliseconds as their first slices and delayed
        them. Queued, they go one at a time behind the live audio. At most ``store_queue``
        wait; past that a store is dropped (counted in ``dropped_stores``): a cache may forget."""
        if len(self._stores) >= self.store_queue:
            self.stats.dropped_stores += 1
            return False
        self._stores.append((fp, line))
        self._store_ready.set()
        return True

    async def run_stores(self) -> None:
        """The worker runs this for as long as it serves (one task)."""
        while True:
            while not self._stores:
                self._store_ready.clear()
                await self._store_ready.wait()
            fp, line = self._stores.popleft()
            try:
                await self.put(fp, line.pcm, line.marks)
            except Exception:  # put counts Redis failures itself; anything else is a bug, keep going
                log.exception("audio cache store failed")

    async def aclose(self) -> None:
        await self._lookups.aclose()
        await self._writes.aclose()

    def _remember(self, fp: str, line: CachedLine) -> None:
        if self.lru_entries <= 0:
            return
        self._lru[fp] = line
        self._lru.move_to_end(fp)
        while len(self._lru) > self.lru_entries:
            self._lru.popitem(last=False)
