"""Intra-op threads that follow how many Piper streams this process runs.

Under load the best use of the cores is one single-threaded ONNX session per context thread (no
thread of one stream waits on another's). A stream running alone leaves the other core idle:
on two cores a second intra-op thread cuts a sentence's synthesis by about 40 % (a 2.7 s phrase:
115 -> 70 ms, measured on a quiet machine). ONNX Runtime fixes a session's thread count when the
session is built, and its run options have no thread setting, so a second session of the same
model with more threads (one per process and model, shared by every context's engine) serves any
piece that starts while its stream is the only one running; the count is read per piece, so a
stream that is joined by others falls back to its own single-threaded session at its next piece.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager
from typing import TypeVar

T = TypeVar("T")

_lock = threading.Lock()
_active = 0
_shared: dict[Hashable, object] = {}


@contextmanager
def streaming() -> Iterator[None]:
    """Count a Piper stream as running for the ``with`` block (any thread)."""
    global _active
    with _lock:
        _active += 1
    try:
        yield
    finally:
        with _lock:
            _active -= 1


def alone() -> bool:
    """Whether exactly one Piper stream is running in this process (the caller's, inside
    :func:`streaming`). A read without the lock: a stale answer costs one piece's threading."""
    return _active == 1


def running() -> int:
    """Piper streams running now in this process."""
    return _active


def shared(key: Hashable, build: Callable[[], T], kind: type[T]) -> T:
    """The process's one ``kind`` for ``key``, built by ``build`` on first use. Raises what
    ``build`` raises (and builds again on the next call)."""
    with _lock:
        found = _shared.get(key)
    if isinstance(found, kind):
        return found
    made = build()  # outside the lock: building an ONNX session takes a few hundred ms
    with _lock:
        found = _shared.setdefault(key, made)
    assert isinstance(found, kind)
    return found
