"""The audio cache's two scripts (workers/audio_cache/cache.py): one slot key each."""

from __future__ import annotations

GET = """
-- KEYS: 1 the slot. ARGV: 1 fingerprint. The slot holds whichever line hashed there last: its PCM
-- comes back only when the fingerprint matches (a miss must not carry another line's audio).
if redis.call('HGET', KEYS[1], 'fp') == ARGV[1] then return redis.call('HMGET', KEYS[1], 'pcm', 'marks') end
return false
"""

PUT = """
-- KEYS: 1 the slot. ARGV: 1 fingerprint, 2 pcm, 3 marks, 4 rate, 5 format version, 6 ttl s.
-- DEL first, so a slot is one entry, never a mix of the old line's fields and the new one's.
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'fp', ARGV[1], 'pcm', ARGV[2], 'marks', ARGV[3], 'rate', ARGV[4], 'v', ARGV[5])
return redis.call('EXPIRE', KEYS[1], ARGV[6])
"""
