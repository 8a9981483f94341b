"""Stream entry ids as every reader of the store compares them."""

from __future__ import annotations

from typing import Any

from voxroom.store.interface import Commands


def entry_id_str(entry_id: Any) -> str:
    """An entry id as text, whether the reply was decoded or not."""
    return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)


def id_tuple(entry_id: str) -> tuple[int, int]:
    """``"1700000000000-3"`` -> ``(1700000000000, 3)``: ids compare as pairs, never as text."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


async def tail(commands: Commands, key: str) -> str:
    """The id of the stream's last entry (``0-0`` when it has none)."""
    last = await commands.call("XREVRANGE", key, "+", "-", "COUNT", 1)
    return entry_id_str(last[0][0]) if last else "0-0"
