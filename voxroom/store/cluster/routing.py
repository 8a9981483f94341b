"""Which key routes a command to its Redis Cluster node: the one rule every cluster path uses
(the per-node autopipeline, the routed calls and blocked reads). Found here without asking Redis
(redis-py's cluster client asks ``COMMAND GETKEYS`` for ``XREAD``, a round trip per command, and
under many concurrent first calls it sent some to the wrong node)."""

from __future__ import annotations

from typing import Any

from voxroom.store.interface import Command

_KEY_AFTER_SUBCOMMAND = frozenset({"XGROUP", "XINFO", "OBJECT", "MEMORY"})
"""``XGROUP CREATE key ...``, ``XINFO GROUPS key``, ``OBJECT ENCODING key``, ``MEMORY USAGE key``."""
_KEYLESS = frozenset({"PING", "INFO", "ASKING", "CLUSTER", "SCRIPT", "TIME", "WAIT", "CLIENT", "CONFIG",
                      "FUNCTION", "DBSIZE", "SSUBSCRIBE", "SUNSUBSCRIBE"})


def command_name(command: Command) -> str:
    head = command[0]
    return (head.decode() if isinstance(head, bytes) else str(head)).upper()


def command_key(command: Command) -> Any | None:
    """The key that routes ``command`` (``None`` for a command without keys: any primary): the
    first key of ``EVAL``/``EVALSHA``, the first stream after ``STREAMS``, the key after a
    subcommand, the first argument of anything else."""
    name = command_name(command)
    if name in ("EVAL", "EVALSHA", "FCALL"):
        return command[3] if int(command[2]) > 0 else None
    if name in ("XREAD", "XREADGROUP"):
        for i, arg in enumerate(command):
            if isinstance(arg, (str, bytes)) and arg.upper() in ("STREAMS", b"STREAMS"):
                return command[i + 1]
        return None
    if name in _KEYLESS:
        return None
    if name in _KEY_AFTER_SUBCOMMAND:
        return command[2] if len(command) > 2 else None
    return command[1] if len(command) > 1 else None
