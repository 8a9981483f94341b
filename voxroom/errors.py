"""The exception tree. Third-party exceptions are translated where they enter voxroom.

::

    VoxroomError
    ├── ConfigError            bad settings or catalog; raised at start-up, never per request
    ├── EngineError            an engine could not load or synthesize
    │   └── ModelNotFound      weights missing or corrupt (clear message, no traceback)
    ├── UnknownVoice           a voice id that the catalog does not have
    └── Overloaded             a bounded queue is full; carries ``retry_after_ms``

Protocol-level problems are :class:`voxroom.protocol.ProtocolError` (kept in the pure protocol
module); ``app/errors.py`` maps both to WebSocket error messages and close codes in one place.
"""

from __future__ import annotations


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
