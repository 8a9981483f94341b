"""Where a running ``voxroom serve`` keeps its Redis, for the commands that look inside it.

``voxroom serve`` starts its own Redis on a free port (a fixed one would collide with a Redis the
machine already runs, or with a second serve). The README's tour then runs ``voxroom rooms``,
which went to 127.0.0.1:6379 and found nothing. Now serve writes its Redis URL to one small file
of the user's, removed when it stops, and ``voxroom rooms`` / ``voxroom room`` read it when
``REDIS_URL`` is not set. The file is trusted only when this user owns it and the serve that
wrote it is still running; a stale one is ignored. A serve given ``REDIS_URL`` writes nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
from pathlib import Path

log = logging.getLogger("voxroom_cli.main")


def path() -> Path:
    """``$XDG_RUNTIME_DIR/voxroom-serve.json`` (private to the user), else one per user in the
    temporary directory."""
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    if runtime:
        return Path(runtime) / "voxroom-serve.json"
    return Path(tempfile.gettempdir()) / f"voxroom-serve-{os.getuid()}.json"


def publish(redis_url: str) -> None:
    """Say where this process's Redis is (mode 0600: the URL may carry a password). A directory
    that cannot be written costs only the discovery: one warning, and serve goes on."""
    target = path()
    tmp = target.with_suffix(f".{os.getpid()}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as out:
            json.dump({"pid": os.getpid(), "redis_url": redis_url}, out)
        os.replace(tmp, target)
    except OSError as exc:
        log.warning("cannot write %s (%s): voxroom rooms will not find this serve's Redis without REDIS_URL",
                    target, exc)


def withdraw() -> None:
    """Remove the file if this process wrote it (a later serve's stays)."""
    found = _read()
    if found is not None and found[0] == os.getpid():
        with contextlib.suppress(FileNotFoundError):
            path().unlink()


def running_serve() -> tuple[int, str] | None:
    """``(pid, redis_url)`` of a ``voxroom serve`` of this user that is running, or None."""
    found = _read()
    if found is None:
        return None
    pid, _ = found
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:  # another user's process holds that pid now
        return None
    return found


def _read() -> tuple[int, str] | None:
    target = path()
    try:
        if target.stat().st_uid != os.getuid():
            return None
        data = json.loads(target.read_text())
        return int(data["pid"]), str(data["redis_url"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
