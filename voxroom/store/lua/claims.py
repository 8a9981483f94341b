"""Keys held by one owner: a client id claimed in a room (voxroom/store/claims.py) and the
sweeper's room lease on a cluster. Each takes, keeps and gives back only what it holds."""

from __future__ import annotations

CLAIM = """
-- KEYS: 1 the claim. ARGV: 1 fresh owner, 2 ttl ms, 3 the secret presented ('' for none),
-- 4 the owner when taken over. Take the claim when it is free, or when the caller presents the
-- secret of the one who holds it (the owner token starts with ``<secret>:``).
-- Returns 1 taken fresh (ARGV[1]), 2 taken over (ARGV[4]), 0 held by another.
local v = redis.call('GET', KEYS[1])
if not v then
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return 1
end
if ARGV[3] ~= '' and string.sub(v, 1, #ARGV[3] + 1) == ARGV[3] .. ':' then
  redis.call('SET', KEYS[1], ARGV[4], 'PX', ARGV[2])
  return 2
end
return 0
"""

RELEASE = """
-- KEYS: 1 the key. ARGV: 1 its holder. Deleted only if still held by that holder (it may have
-- expired and been taken since).
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

RELEASE_MANY = """
-- KEYS: the keys. ARGV: their holders, in the same order. RELEASE for each.
local n = #KEYS
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i] then redis.call('DEL', key) end
end
return n
"""

REFRESH = """
-- KEYS: the keys. ARGV: 1 ttl ms, then their holders in the same order. Refresh ours; re-take one
-- that vanished (Redis restarted empty). One someone else holds now (ours expired while Redis was
-- unreachable) is theirs: counted, not stolen back. Returns that count.
local lost = 0
for i, key in ipairs(KEYS) do
  local owner = redis.call('GET', key)
  if owner == ARGV[i + 1] then
    redis.call('PEXPIRE', key, ARGV[1])
  elseif not owner then
    redis.call('SET', key, ARGV[i + 1], 'PX', ARGV[1])
  else
    lost = lost + 1
  end
end
return lost
"""
