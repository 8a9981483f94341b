"""The scripts on a job stream (``vx:jobs``, or a cluster's job shards ``vx:jobs:{jK}``), and the
cluster's take of a line in its room's slot."""

from __future__ import annotations

from voxroom.store.lua.common import PENDING, ROOM

ACK = PENDING + """
-- KEYS: 1 the job stream. ARGV: 1 group, 2 entry id, 3 consumer. XACK if the entry is still ours.
if not pending_to(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) then return 0 end
return redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
"""

TOUCH = PENDING + """
-- KEYS: 1 the job stream. ARGV: 1 group, 2 consumer, then entry ids. Resets the idle time of the
-- entries this consumer still owns (so nobody claims them from a live worker); returns the ids
-- it no longer owns.
local lost = {}
for i = 3, #ARGV do
  if pending_to(KEYS[1], ARGV[1], ARGV[i], ARGV[2]) then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
  else
    lost[#lost + 1] = ARGV[i]
  end
end
return lost
"""

DELIVERIES = """
-- KEYS: 1 the job stream. ARGV: 1 group, 2 entry id. The entry's pending record (its delivery
-- count is the 4th field); raw, where a client would parse it as a summary.
return redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
"""

VERSION = """
-- KEYS: 1 any key (it routes the script to that key's node). Redis 7.0 and later give their
-- version; older ones nil.
return redis.REDIS_VERSION
"""

TAKE = ROOM + """
-- Redis Cluster: make a worker the owner of a line, in the room's slot. KEYS: 1 state. ARGV:
-- 1 owner field, 2 token (``deliveries|consumer|entry``), 3 deliveries, 4 entry, 5 ttl,
-- 6 only_unset. Returns 1 taken, 0 a later delivery of this entry owns the line (a stale worker
-- waking after its job was adopted), -1 another entry does (the same line handed twice).
local v = redis.call('HGET', KEYS[1], ARGV[1])
if v and v ~= ARGV[2] then
  local d, entry = string.match(v, '^(%d+)|.*|([^|]*)$')
  if entry ~= ARGV[4] then return -1 end
  if tonumber(d) >= tonumber(ARGV[3]) then return 0 end
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
refresh(KEYS[1], ARGV[5], ARGV[6])
return 1
"""
