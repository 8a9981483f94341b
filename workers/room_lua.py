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

TURN_LUA = """\
local function our_turn(state, seq)
  return tonumber(redis.call('HGET', state, 'next') or '1') == tonumber(seq)
end
"""
"""The turn fence every script that writes a line's output into its room shares (workers/bus.py,
workers/shards.py): ``our_turn(state, seq)`` is whether the room's ``next`` is ``seq`` (a missing
``next`` is 1, as ``wait_for_turn`` reads it). One HGET: a script checks it once per job. A line
publishes only in its turn (``workers/output/publisher.py``), and ``next`` moves past it only by its own
end or by a later line's skip; the fence makes Redis refuse the line's writes after such a skip,
atomically with them, instead of letting them interleave with the line that skipped."""

PENDING_LUA = """\
local function pending_to(jobs, group, id, consumer)
  local p = redis.pcall('XPENDING', jobs, group, id, id, 1)
  if type(p) ~= 'table' or p.err then return false end
  return p[1] ~= nil and p[1][2] == consumer
end
"""
"""The ownership fence by a job stream's pending list (workers/bus.py's ``owned``, workers/shards.py's
ack and keeper): ``pending_to(jobs, group, id, consumer)`` is whether entry ``id`` is pending to
``consumer``. A missing group (Redis came back empty) is "not ours": that job is gone anyway."""
