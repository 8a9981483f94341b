"""What each setting accepts, checked once at the edge (``Settings.from_env``, the CLI's flags).

A value outside its range used to start a process that misbehaved later and quietly:
``VOXROOM_SEND_QUEUE_SLICES=0`` made every listener's queue unbounded (``asyncio.Queue(0)``),
``VOXROOM_SAY_RATE=nan`` a rate limiter that compares against NaN, ``VOXROOM_MAX_CONNECTIONS=-1`` a
gateway that refuses everyone, ``VOXROOM_ROOM_IDLE_TTL_S=0`` a failed startup with a traceback, and
``VOXROOM_PORT=abc`` a ``ValueError`` traceback. Now the process does not start, and one message
names every bad variable with the value given and what it takes.

Only what is wrong in every deployment is refused; a rule never encodes a recommendation (a
``say_rate`` of 100000 is a load test's choice, not an error).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

Rule = Callable[[Any], str | None]
"""What is wrong with a value (the phrase after "must be"), or ``None`` when it is fine."""


def at_least(low: int) -> Rule:
    def rule(value: Any) -> str | None:
        return None if value >= low else f"at least {low}"
    return rule


def between(low: int, high: int) -> Rule:
    def rule(value: Any) -> str | None:
        return None if low <= value <= high else f"from {low} to {high}"
    return rule


def finite_above(low: float, *, inclusive: bool = False, infinite_ok: bool = False) -> Rule:
    """A float above ``low`` (or equal, with ``inclusive``); never NaN; infinity only when
    ``infinite_ok`` says it means something ("never")."""
    words = f"{'at least' if inclusive else 'above'} {low:g}"
    if infinite_ok:
        words += " (inf: never)"
    else:
        words = "a finite number " + words

    def rule(value: Any) -> str | None:
        if math.isnan(value) or (math.isinf(value) and not infinite_ok):
            return words
        return None if (value >= low if inclusive else value > low) else words
    return rule


def one_of(*choices: str, case: bool = True) -> Rule:
    def rule(value: Any) -> str | None:
        seen = value if case else str(value).upper()
        return None if seen in choices else "one of " + ", ".join(choices)
    return rule


def off_or_between(low: int, high: int) -> Rule:
    def rule(value: Any) -> str | None:
        return None if value == 0 or low <= value <= high else f"0 (off) or from {low} to {high}"
    return rule


PORT = between(0, 65_535)

RULES: Mapping[str, Rule] = {
    "log_level": one_of("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL", case=False),
    "log_format": one_of("text", "json"),
    # gateway
    "port": PORT,
    "max_connections": at_least(1),
    "max_connections_per_address": at_least(0),
    "send_queue_slices": at_least(1),
    "utterance_stream_maxlen": at_least(1),
    "resume_window_ms": at_least(1),
    "room_idle_ttl_s": at_least(1),
    "jobs_maxlen": at_least(1),
    "max_pending_per_room": at_least(1),
    "redis_wait_replicas": at_least(0),
    "redis_wait_timeout_ms": at_least(1),
    "say_rate": finite_above(0),
    "say_burst": finite_above(1, inclusive=True),
    "frame_rate": finite_above(0),
    "frame_burst": finite_above(1, inclusive=True),
    "flood_close_after": at_least(1),
    "flood_ban_s": finite_above(0, inclusive=True),
    "send_stall_close_s": finite_above(0),
    "handshake_timeout_s": finite_above(0),
    "resume_rate": finite_above(0),
    "resume_burst": finite_above(1, inclusive=True),
    "send_buffer_bytes": at_least(0),
    # worker
    "engine": one_of("auto", "offline", "chattts", "synthetic"),
    "cpu_contexts": at_least(1),
    "context_queue": at_least(1),
    "context_inflight": at_least(1),
    "context_backlog": at_least(0),
    "claim_idle_ms": at_least(1),
    "max_utterance_ms": at_least(1),
    "order_wait_ms": at_least(1),
    # Below one slice the publisher finds every slice late and moves the rest later, forever.
    "lead_ms": at_least(40),
    "open_line_idle_s": finite_above(0),
    "chattts_source": one_of("huggingface", "local", "custom"),
    "chattts_empty_cache_every": at_least(0),
    "chattts_max_batch": at_least(1),
    "chattts_interpolation_steps": at_least(1),
    "chattts_switch_lines": at_least(1),
    "chattts_fade_ms": finite_above(0, inclusive=True),
    "chattts_max_new_tokens": at_least(1),
    "chattts_yield_ahead_s": finite_above(0, inclusive=True, infinite_ok=True),
    "chattts_speaker_cache": at_least(1),
    "piper_solo_threads": at_least(1),
    "piper_first_piece_words": at_least(0),
    "batch_window_ms": at_least(0),
    "synthetic_ttfc_ms": finite_above(0, inclusive=True),
    "synthetic_rtf": finite_above(0, inclusive=True),
    "synthetic_max_batch": at_least(1),
    "worker_metrics_port": PORT,
    # voices, cache, opus (libopus takes 6 to 510 kb/s)
    "opus_bitrate": off_or_between(6_000, 510_000),
    "cache_slots": at_least(0),
    "cache_entry_max_bytes": at_least(1),
    "cache_ttl_s": at_least(1),
    "cache_lru_entries": at_least(0),
    "speech_max_streams": at_least(0),
    "speech_max_streams_per_client": at_least(0),
    "job_shards": between(1, 16_384),
}


def problems(values: Mapping[str, Any], flags: Mapping[str, str] | None = None) -> list[str]:
    """``VOXROOM_NAME=value must be ...`` for every value in ``values`` (field name -> value) that
    its rule refuses, in the order given; ``--flag value must be ...`` for a field that ``flags``
    names (field -> the command-line flag it came from): the operator typed the flag, not the
    variable."""
    found = []
    for name, value in values.items():
        rule = RULES.get(name)
        wrong = rule(value) if rule is not None and value is not None else None
        if wrong is not None:
            flag = (flags or {}).get(name)
            said = f"{flag} {value!r}" if flag else f"VOXROOM_{name.upper()}={value!r}"
            found.append(f"{said} must be {wrong}")
    return found
