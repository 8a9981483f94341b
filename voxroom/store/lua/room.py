"""The scripts that write a line's audio into its room, fenced: publish, finish, skip, pass,
release; and the room's ``cancel``.

**The ownership fence is checked by Redis, not by the worker's clock.** A worker paused (SIGSTOP, a
long GC) past the claim time loses its job to another worker; when it wakes it still believes it
owns it. So every write a worker makes for a job is one of these scripts, and each first checks
that the job is still this worker's, atomically with the write; the slices and the ``end`` also
check that the room's ``next`` is still the line's seq (the turn fence, ``common.TURN``).

Where the fence lives is the one difference between the two Redis modes, and it is the piece each
script starts with (:data:`SINGLE` or :data:`CLUSTER`), three Lua functions of the same names:

- ``owned(state, a, b)``: whether the job is ours. One Redis: the job stream's pending list names
  this consumer for entry ``a`` (``b`` the consumer; ``KEYS[1]`` the job stream). A cluster: the
  room's ``:state`` field ``a`` (``owner:<seq>``) holds our token ``b``, in the room's own slot,
  since the job's shard lies in another slot (docs/cluster.md; ``KEYS[1]`` is then a key of the
  room's slot and unused).
- ``done(state, a)``: the job is finished as far as this slot goes. One Redis: ``XACK`` (the end,
  the turn handover and the ack are one step). A cluster: the owner field goes; the ``XACK`` on
  the shard follows (``jobs.ACK``): a crash between the two leaves the job pending, and the worker
  that adopts it finds ``next`` past its seq and acks it without publishing.
- ``ring(output)``: a cluster rings the room's doorbell (``SPUBLISH vx:room:{R}:bell``, same slot)
  once per line per script, which the gateways subscribed to it read the room on
  (voxroom/store/cluster/bells.py; Redis 7.0). One Redis has no bell: the gateways' blocked
  ``XREAD`` wakes by itself.

Every script here takes ``KEYS[1]`` (the fence's key) first and each job's fence arguments
``a, b`` in the same place of its ``ARGV``, so the bodies are the same text in both modes.
"""

from __future__ import annotations

from voxroom.store import keys
from voxroom.store.lua import lines
from voxroom.store.lua.common import CANCELS, PENDING, ROOM, TURN

SINGLE = PENDING + f"""\
local function owned(state, a, b) return pending_to(KEYS[1], '{keys.JOBS_GROUP}', a, b) end
local function done(state, a) redis.call('XACK', KEYS[1], '{keys.JOBS_GROUP}', a) end
local function ring(output) end
"""
"""The fence on one Redis: ``vx:jobs``'s pending list (``a`` the entry id, ``b`` the consumer)."""

CLUSTER = """\
local function owned(state, a, b) return redis.call('HGET', state, a) == b end
local function done(state, a) redis.call('HDEL', state, a) end
local function ring(output) return redis.call('SPUBLISH', string.sub(output, 1, -4) .. 'bell', '') end
"""
"""The fence on a cluster: the owner field in the room's ``:state`` (``a`` the field, ``b`` the
token the worker wrote when it took the line, ``jobs.TAKE``)."""

_PUBLISH = """
-- KEYS: 1 the fence's key, then per job its output stream and state hash (all of one slot).
-- ARGV: 1 window_ms, 2 ttl, then per job: fence a, fence b, seq, only_unset, started ('' for
-- none), maintain ('1': trim and refresh the TTLs), final ('1': the slice that ends a cancelled
-- line, written although it is cancelled), its number of entries, then per entry its number of
-- field pairs and the pairs.
-- Returns per job 1 (written), 0 (not ours: nothing written for it), -1 (ours, but the room's
-- next is not its seq any more: skipped past, nothing written), -2 (ours and its turn, but the
-- line was cancelled: nothing written) or the message of the error one of its commands raised
-- (the other jobs are not affected).
-- Cost per job: the fence and one HMGET (the turn and the cancelled lines), whatever its number
-- of entries.
if redis.replicate_commands then redis.replicate_commands() end
local window, ttl = ARGV[1], ARGV[2]
local results = {}
local trim = nil
local a = 3
for j = 1, (#KEYS - 1) / 2 do
  local out, state = KEYS[2 * j], KEYS[2 * j + 1]
  local fa, fb, seq, only_unset, started = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3], ARGV[a + 4]
  local maintain, final = ARGV[a + 5] == '1', ARGV[a + 6] == '1'
  local first = a + 8
  local last = first
  for _ = 1, tonumber(ARGV[a + 7]) do last = last + 1 + tonumber(ARGV[last]) * 2 end
  a = last
  local turn = owned(state, fa, fb) and redis.call('HMGET', state, 'next', 'cancelled')
  if not turn then
    results[j] = 0
  elseif tonumber(turn[1] or '1') ~= tonumber(seq) then
    results[j] = -1
  elseif not final and listed(turn[2], seq) then
    results[j] = -2
  else
    local ok, err = pcall(function()
      local head = {'XADD', out, '*'}
      -- A private room (only_unset '1': a speech response's) is trimmed by its gateway as it sends
      -- it, never here: a slow reader must not lose what it has not read yet.
      if maintain and only_unset ~= '1' then
        trim = trim or minid(window)
        head = {'XADD', out, 'MINID', '~', trim, '*'}
      end
      local i = first
      while i < last do
        local n = tonumber(ARGV[i]) * 2
        local cmd = {unpack(head)}
        for k = i + 1, i + n do cmd[#cmd + 1] = ARGV[k] end
        redis.call(unpack(cmd))
        i = i + n + 1
      end
      if started ~= '' then redis.call('HSET', state, 'started', started) end
      if maintain then
        refresh(out, ttl, only_unset)
        refresh(state, ttl, only_unset)
      end
      ring(out)
    end)
    if ok then
      results[j] = 1
    elseif type(err) == 'table' then
      results[j] = tostring(err.err or err)
    else
      results[j] = tostring(err)
    end
  end
end
return results
"""

_FINISH = """
-- KEYS: 1 the fence's key, 2 output, 3 state. ARGV: 1 fence a, 2 fence b, 3 window_ms, 4 ttl,
-- 5 only_unset, 6 next, 7 end_ms, 8 cut ('1': the end of a cancelled line), then the end entry's
-- field pairs. The end, the turn handover and ``done`` are one step. Returns 1, 0 (not ours), -1
-- (ours, but the room's next is not this line's seq: nothing written, not done) or -2 (the line
-- was cancelled and this is not its cut end: nothing written). So ``next`` only ever moves from
-- this seq to the one after it: never back, never past a line that skipped past this one and may
-- be playing; and a cancelled line ends ``cancelled``, never ``ok``.
if not owned(KEYS[3], ARGV[1], ARGV[2]) then return 0 end
local seq = tonumber(ARGV[6]) - 1
if not our_turn(KEYS[3], seq) then return -1 end
if ARGV[8] ~= '1' and listed(redis.call('HGET', KEYS[3], 'cancelled'), seq) then return -2 end
redis.call('XADD', KEYS[2], 'MINID', '~', ARGV[5] == '1' and '0' or minid(ARGV[3]), '*', unpack(ARGV, 9))
uncancel(KEYS[3], seq)
redis.call('HSET', KEYS[3], 'next', ARGV[6])
local e = tonumber(redis.call('HGET', KEYS[3], 'end_ms') or '0')
if e < tonumber(ARGV[7]) then redis.call('HSET', KEYS[3], 'end_ms', ARGV[7]) end
done(KEYS[3], ARGV[1])
refresh(KEYS[2], ARGV[4], ARGV[5])
refresh(KEYS[3], ARGV[4], ARGV[5])
ring(KEYS[2])
return 1
"""

_SKIP = """
-- KEYS: 1 the fence's key, 2 state. ARGV: 1 fence a, 2 fence b, 3 seq. The room's next moves up
-- to seq (a line gave up waiting for a predecessor that never finished), never back.
if not owned(KEYS[2], ARGV[1], ARGV[2]) then return 0 end
local n = tonumber(redis.call('HGET', KEYS[2], 'next') or '1')
if n < tonumber(ARGV[3]) then redis.call('HSET', KEYS[2], 'next', ARGV[3]) end
return 1
"""

_PASS = """
-- KEYS: 1 the fence's key, 2 output, 3 state. ARGV: 1 fence a, 2 fence b, 3 seq. A line cancelled
-- before anything of it was written: in its turn the room's next moves past it, and it is done,
-- with no start and no end in the room; a ``pass`` entry (which no client is sent) wakes the
-- workers waiting for the next turn. Returns 1, 0 (not ours) or -1 (not its turn: nothing done).
if not owned(KEYS[3], ARGV[1], ARGV[2]) then return 0 end
if not our_turn(KEYS[3], ARGV[3]) then return -1 end
redis.call('HSET', KEYS[3], 'next', tonumber(ARGV[3]) + 1)
uncancel(KEYS[3], ARGV[3])
done(KEYS[3], ARGV[1])
redis.call('XADD', KEYS[2], '*', 'kind', 'pass', 'seq', ARGV[3])
ring(KEYS[2])
return 1
"""

_CANCEL = """
-- KEYS: 1 state, 2 utt, 3 seq, 4 output (all of the room's slot). ARGV: 1 what ('utterance',
-- 'seq' or 'all'), 2 its number (a room number, or the canceller's say seq; '' for all), 3 the
-- canceller's client id, 4 host ('1': may cancel any line). The lines not yet finished (from the
-- room's next to its last number) that match and that the canceller may cancel join the room's
-- ``cancelled`` list, and a ``cancel`` entry (which no client is sent) wakes the workers waiting
-- on the room: the line playing stops at its next publish, a waiting one is passed in its turn.
-- Returns {1, room numbers...}, {-1} (no such line not yet finished: not found) or {-2} (the line
-- is another client's and the canceller is no host: forbidden). An ``all`` finds what it may.
local what, value, who, host = ARGV[1], ARGV[2], ARGV[3], ARGV[4] == '1'
local nxt = tonumber(redis.call('HGET', KEYS[1], 'next') or '1')
local last = tonumber(redis.call('GET', KEYS[3]) or '0')
local list = redis.call('HGET', KEYS[1], 'cancelled')
local found, matched, refused = {}, false, false
if last >= nxt then
  for _, e in ipairs(redis.call('XREVRANGE', KEYS[2], '+', '-', 'COUNT', last - nxt + 17)) do
    local f, s, sender, cs = e[2], nil, nil, nil
    for i = 1, #f, 2 do
      if f[i] == 'seq' then s = tonumber(f[i + 1])
      elseif f[i] == 'sender' then sender = f[i + 1]
      elseif f[i] == 'client_seq' then cs = f[i + 1] end
    end
    if s and s >= nxt and s <= last and not listed(list, s) then  -- a line cancelled already: gone
      if what == 'all' or (what == 'utterance' and s == tonumber(value))
          or (what == 'seq' and sender == who and cs == value) then
        matched = true
        if host or sender == who then found[#found + 1] = s else refused = true end
      end
    end
  end
end
if what ~= 'all' and not matched then return {-1} end
if what ~= 'all' and refused then return {-2} end
if #found > 0 then
  local all = {}
  if list then for v in string.gmatch(list, '%d+') do all[#all + 1] = v end end
  for _, s in ipairs(found) do all[#all + 1] = tostring(s) end
  redis.call('HSET', KEYS[1], 'cancelled', table.concat(all, ' '))
  -- What operators see (``voxroom room ID``): the room's last 32 cancelled numbers, kept past
  -- their lines' ends (``cancelled`` itself empties as they end).
  local recent = {}
  local old = redis.call('HGET', KEYS[1], 'cancelled_recent')
  if old then for v in string.gmatch(old, '%d+') do recent[#recent + 1] = v end end
  for _, s in ipairs(found) do recent[#recent + 1] = tostring(s) end
  while #recent > 32 do table.remove(recent, 1) end
  redis.call('HSET', KEYS[1], 'cancelled_recent', table.concat(recent, ' '))
  redis.call('XADD', KEYS[4], '*', 'kind', 'cancel', 'utterances', table.concat(found, ' '))
  ring(KEYS[4])
end
local reply = {1}
for _, s in ipairs(found) do reply[#reply + 1] = s end
return reply
"""

_RELEASE = """
-- KEYS: 1 the fence's key, 2 state. ARGV: 1 fence a, 2 fence b. A job that ended without a finish
-- (stale, skipped past): ``done`` if it is still ours. Returns 1, or 0 (not ours: nothing done).
if not owned(KEYS[2], ARGV[1], ARGV[2]) then return 0 end
done(KEYS[2], ARGV[1])
return 1
"""


class RoomScripts:
    """The room's scripts with one mode's fence in front (:data:`SINGLE` or :data:`CLUSTER`)."""

    __slots__ = ("append", "cancel", "close_idle", "finish", "flush", "pass_turn", "publish", "release", "skip")

    def __init__(self, fence: str) -> None:
        prelude = fence + ROOM + TURN + CANCELS
        self.publish = prelude + _PUBLISH
        self.finish = prelude + _FINISH
        self.skip = prelude + _SKIP
        self.pass_turn = prelude + _PASS
        self.release = prelude + _RELEASE
        self.cancel = prelude + _CANCEL
        # An open line's pieces (voxroom/store/lua/lines.py): only ``ring`` of the prelude.
        self.append = prelude + lines.APPEND
        self.flush = prelude + lines.FLUSH
        self.close_idle = prelude + lines.CLOSE_IDLE
