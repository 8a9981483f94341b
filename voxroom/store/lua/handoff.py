"""Redis Cluster's hand-off of accepted lines to their job shard, and its sweeper's upkeep
(voxroom/store/cluster/ingress.py, voxroom/store/cluster/sweeper.py; docs/cluster.md)."""

from __future__ import annotations

HAND = """
-- KEYS: 1 shard stream, 2 shard :handed, 3 shard :handed_at. ARGV: 1 room, 2 seq, 3 epoch,
-- 4 jobs maxlen, 5 now ms, 6 after, then the job's field pairs (seq among them). Adds the job
-- unless the shard's high-water mark for the room says it has it, and moves the mark. Returns 1
-- added, 0 had, or -1 - held when the shard lacks lines before this one: it holds the room's
-- lines up to held only, and lines above both held and ARGV 6 (the caller's floor: lines at or
-- below it need not be in the shard, they played) are missing. A failover of the shard's primary
-- lost their hand-off; adding this line would move the mark past them, and no one would ever hand
-- them again. The caller hands them first.
local held = 0
local v = redis.call('HGET', KEYS[2], ARGV[1])
if v then
  local e, s = string.match(v, '^(.*):(%d+)$')
  if e == ARGV[3] then
    held = tonumber(s)
    if held >= tonumber(ARGV[2]) then return 0 end
  end
end
if math.max(held, tonumber(ARGV[6])) < tonumber(ARGV[2]) - 1 then return -1 - held end
redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], '*', 'room', ARGV[1], unpack(ARGV, 7))
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3] .. ':' .. ARGV[2])
redis.call('ZADD', KEYS[3], ARGV[5], ARGV[1])
return 1
"""

RECORD = """
-- KEYS: 1 state. ARGV: 1 seq, 2 epoch. Every line of the room up to seq is in its shard: handed
-- moves forward only, and only for the same epoch.
if redis.call('HGET', KEYS[1], 'epoch') ~= ARGV[2] then return 0 end
if tonumber(redis.call('HGET', KEYS[1], 'handed') or '0') < tonumber(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'handed', ARGV[1])
end
return 1
"""

PRUNE = """
-- KEYS: 1 shard :handed, 2 shard :handed_at. ARGV: 1 cutoff ms, 2 at most. The high-water marks
-- of rooms with no hand-off since the cutoff go.
local old = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', '(' .. ARGV[1], 'LIMIT', 0, ARGV[2])
if #old > 0 then
  redis.call('HDEL', KEYS[1], unpack(old))
  redis.call('ZREM', KEYS[2], unpack(old))
end
return #old
"""
