"""Lua that every script writing a room's output shares (workers/bus.py; workers/shards.py on a
cluster)."""

from __future__ import annotations

ROOM_LUA = """\
local function minid(window_ms)
  if redis.replicate_commands then redis.replicate_commands() end
  local t = redis.call('TIME')
  return string.format('%d', tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - tonumber(window_ms))
end
local function refresh(key, ttl, only_unset)
  if only_unset == '1' then
    if redis.call('TTL', key) == -1 then redis.call('EXPIRE', key, ttl) end
  else
    redis.call('EXPIRE', key, ttl)
  end
end
"""
"""Lua shared by every script that writes a room's output (workers/bus.py, and workers/shards.py on a
cluster): the trim point by Redis ``TIME`` (``minid``) and the room keys' TTL (``refresh``)."""
