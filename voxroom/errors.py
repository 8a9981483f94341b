"""The exception tree. Third-party exceptions are translated where they enter voxroom.

::

    VoxroomError
    ├── ConfigError            bad settings or catalog; raised at start-up, never per request
    ├── EngineError            an engine could not load or synthesize
    │   └── ModelNotFound      weights missing or corrupt (clear message, no traceback)
    ├── UnknownVoice           a voice id that the catalog does not have
    ├── Overloaded             a bounded queue is full; carries ``retry_after_ms``
    ├── NotReplicated          a line is in the primary, ``WAIT`` did not confirm its replicas;
    │                          also a redis-py ``TimeoutError`` (below)
    ├── OwnershipLost          Redis refused a worker's write for a job another worker owns now
    │   ├── TurnLost           ... or whose room's turn moved past it (a later line skipped it)
    │   └── LineCancelled      ... or whose line was cancelled
    ├── CancelRefused          a ``cancel`` that cancels nothing (``not_found``, ``forbidden``)
    ├── LineRefused            an ``append`` or ``flush`` not taken (``duplicate``, ``not_found``...)
    └── ResponseCut            a streamed speech response cannot be finished whole: it must end
        ├── StreamGap          visibly broken (no terminating chunk); entries it needs are gone;
        └── TakesDiffer        a line restarted mid-way is not the audio already sent

Protocol-level problems are :class:`voxroom.wire.protocol.ProtocolError` (kept in the pure protocol
module); the room endpoint (``app/room/ws.py``) turns them into ``error`` messages or close codes.

Redis is not in this tree: "Redis cannot serve us now" is one tuple of redis-py's own classes,
``voxroom.store.backoff.REDIS_DOWN`` (connection lost, timeout, ``-LOADING``, ``-OOM``, ``-READONLY``,
``-MASTERDOWN``); ``voxroom/store/autopipe.py`` raises the same classes for its error replies, so a
retry loop catches one class whichever client raised it. :class:`NotReplicated` is of both: a
caller that only knows "Redis cannot serve us now" treats it so (the client resends), one that
knows the line is already in the primary catches it first (``app/room/ws.py``).
"""

from __future__ import annotations

from redis.exceptions import TimeoutError as RedisTimeoutError


class VoxroomError(Exception):
    """Base of every exception voxroom raises on purpose."""


class ConfigError(VoxroomError):
    pass


class EngineError(VoxroomError):
    pass


class ModelNotFound(EngineError):
    pass


class UnknownVoice(VoxroomError):
    def __init__(self, voice: str) -> None:
        super().__init__(f"unknown voice {voice!r}")
        self.voice = voice


class Overloaded(VoxroomError):
    def __init__(self, message: str, retry_after_ms: int) -> None:
        super().__init__(message)
        self.retry_after_ms = retry_after_ms


class NotReplicated(VoxroomError, RedisTimeoutError):
    """A line (or the line a ``duplicate`` answers for) is in the primary, but ``WAIT`` did not
    confirm that the configured number of replicas have it in time
    (``voxroom/store/replicas.py``). A ``TimeoutError`` of redis-py, so it is one of
    ``voxroom.store.backoff.REDIS_DOWN``: the room WebSocket answers ``unavailable`` with
    ``retry_after_ms`` and the client resends the same seq, which the say script answers
    ``duplicate`` after a ``WAIT`` of its own. Never ``accepted`` for a line a failover may lose."""


class OwnershipLost(VoxroomError):
    """Redis refused a write for a job: another worker claimed it while this one was not looking
    (paused, or cut off from Redis past the claim time). Drop the job: no more writes, no ack (the
    new owner acks it). Raised by the job bus (voxroom/store/jobs.py)."""


class TurnLost(OwnershipLost):
    """Redis refused a write for a job that is still ours because the room's turn is no longer
    its line's: ``next`` moved past its seq (a later line skipped past it, see
    ``workers/output/publisher.py``) after its turn check. Nothing of that write landed: it would
    have interleaved with the line that skipped. The publisher drops the line as stale and acks it;
    anything else that sees it treats it as :class:`OwnershipLost` (no more writes)."""


class ResponseCut(VoxroomError):
    """A ``POST /v1/audio/speech`` response already under way that cannot be finished whole
    (Redis lost, no worker output in time, a line failed, ...). Its body must not end cleanly:
    ``app/api/speech_stream.py`` closes the connection before the terminating chunk, which HTTP
    clients report as an incomplete body. ``reason`` is a short label for logs and metrics."""

    reason = "failed"

    def __init__(self, message: str, reason: str | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason


class StreamGap(ResponseCut):
    """Entries a response needs are missing from its room's output stream (trimmed, or lost by a
    Redis that restarted): what it would send is not the whole audio."""

    reason = "gap"


class TakesDiffer(ResponseCut):
    """A line was restarted by another worker after part of it was sent, and the new take is not
    the same audio: continuing would splice two different takes (app/api/speech_takes.py)."""

    reason = "takes_differ"


class LineCancelled(OwnershipLost):
    """Redis refused a write for a job that is still ours and in its turn because its line was
    cancelled (``cancel``): nothing of that write landed. The publisher ends the line at the cut
    (a fade-out slice and an ``end`` ``cancelled``), or passes its turn when nothing of it was
    written yet. Anything else that sees it treats it as :class:`OwnershipLost`."""


class LineRefused(VoxroomError):
    """An open line's ``append`` or ``flush`` that was not stored: ``code`` says why (``duplicate``:
    that part is stored already; ``not_found``: no such open line, or it is closed; ``bad_message``:
    a gap in the parts; ``text_too_long``: past the line's bounds)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


class CancelRefused(VoxroomError):
    """A ``cancel`` that cancels nothing: ``code`` ``not_found`` (no such line not yet finished) or
    ``forbidden`` (another client's line, and the canceller is no host)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
