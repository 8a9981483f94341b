"""Lua helpers several scripts share: the trim point by Redis ``TIME``, the room keys' TTL, the
turn fence, the room's cancelled lines and the pending-list fence."""

from __future__ import annotations

ROOM = """\
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
"""``minid(window_ms)``: the ``MINID`` that keeps the resume window (by Redis's clock, not the
caller's). ``refresh(key, ttl, only_unset)``: the room keys' TTL; a private API room
(``only_unset`` '1') gets one only when it has none: its gateway deletes it, or gives it a short
TTL when the caller left, and a worker must not lengthen that."""

TURN = """\
local function our_turn(state, seq)
  return tonumber(redis.call('HGET', state, 'next') or '1') == tonumber(seq)
end
"""
"""``our_turn(state, seq)``: whether the room's ``next`` is ``seq`` (a missing ``next`` is 1). A
line publishes only in its turn, and ``next`` moves past it only by its own end or by a later
line's skip; the fence makes Redis refuse the line's writes after such a skip, atomically with
them, instead of letting them interleave with the line that skipped."""

CANCELS = """\
local function listed(list, seq)
  return list and string.find(' ' .. list .. ' ', ' ' .. seq .. ' ', 1, true) ~= nil
end
local function uncancel(state, seq)
  local list = redis.call('HGET', state, 'cancelled')
  if not list then return end
  local kept = {}
  for v in string.gmatch(list, '%d+') do
    if tonumber(v) ~= tonumber(seq) then kept[#kept + 1] = v end
  end
  if #kept > 0 then redis.call('HSET', state, 'cancelled', table.concat(kept, ' ')) else
    redis.call('HDEL', state, 'cancelled') end
end
"""
"""The room's cancelled lines: ``:state`` field ``cancelled``, their room numbers separated by
spaces, each there from its ``cancel`` until the line's end (or its pass, when it never began).
``listed(list, seq)``: ``seq`` is in ``list`` (the field's value, or false). ``uncancel(state,
seq)``: ``seq`` leaves it. Bounded by the lines a room may have pending (``max_pending_per_room``)."""

PENDING = """\
local function pending_to(jobs, group, id, consumer)
  local p = redis.pcall('XPENDING', jobs, group, id, id, 1)
  if type(p) ~= 'table' or p.err then return false end
  return p[1] ~= nil and p[1][2] == consumer
end
"""
"""``pending_to(jobs, group, id, consumer)``: whether entry ``id`` of job stream ``jobs`` is
pending to ``consumer``. A missing group (Redis came back empty) is "not ours": that job is gone
anyway."""
