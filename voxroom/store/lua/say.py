"""The ``say`` script: one line accepted atomically (dedupe, back-pressure, the room's next
number, the voice switch), then written where its mode hands it to the workers.

One Redis writes the line to the room's log and to ``vx:jobs`` in the same script
(:data:`SINGLE`). A cluster cannot (``vx:jobs`` would be another slot): it writes the room's log
and returns what the hand-off to the room's job shard needs (:data:`CLUSTER`,
voxroom/store/cluster/ingress.py). Everything before the write is :data:`BODY`, the same text in
both.
"""

from __future__ import annotations

# KEYS: 1 senders, 2 seq, 3 utt, 4 jobs, 5 state, 6 rooms, 7 out, 8 the open line's pieces
#       (keys.open_line: written only when the line is open).
# ARGV: 1 sender, 2 client seq, 3 text, 4 voice, 5 now ms, 6 utt maxlen, 7 jobs maxlen, 8 room,
#       9 max pending, 10 idle ttl s, 11 stale cutoff ms, 12 stale entries per call, 13 switch lines,
#       14 the line's own lexicon as JSON ('' for none), 15 a private line's audience: client ids
#       separated by spaces ('' for the whole room), 16 '1' for an open line (more text follows in
#       ``append`` parts), 17 the length of its text in code points.
GAPS_KEPT = 32
"""How far below a sender's last stored seq a line never stored may still be resent and spoken
(``duplicate`` means stored: a resend within this of the last is checked against the seqs that were
skipped; an older one is refused ``seq_too_old``, stored or not: the script no longer knows).
Far more than any client keeps in flight (client_js keeps 32 lines waiting at most)."""

BODY = f"\nlocal GAPS_KEPT = {GAPS_KEPT}" + """
local last = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
local cs = tonumber(ARGV[2])
local gaps_field = ARGV[1] .. '|gaps'
local gaps = redis.call('HGET', KEYS[1], gaps_field) or ''
local gap = false
if cs <= last then
  -- Below the last line stored for this sender: a resend. Stored already (duplicate), unless it is
  -- one of the seqs the sender skipped when a later one was stored (refused, or still on its way).
  gap = string.find(' ' .. gaps .. ' ', ' ' .. cs .. ' ', 1, true) ~= nil
  if not gap then
    -- More than GAPS_KEPT below: its gap, if it was one, is forgotten. Stored or not, nobody can
    -- tell now; "duplicate" would claim it was, so it is refused as too old (and not stored).
    if cs <= last - GAPS_KEPT then return {-2, last} end
    return {0, last}
  end
end
local nxt = tonumber(redis.call('HGET', KEYS[5], 'next') or '1')
local seq = redis.call('GET', KEYS[2])
if not seq then
  seq = nxt - 1
elseif redis.call('HEXISTS', KEYS[5], 'voice') == 0 then
  seq = tonumber(seq)
  nxt = seq + 1
  redis.call('HSET', KEYS[5], 'next', nxt)
else
  seq = tonumber(seq)
end
if seq - nxt + 1 >= tonumber(ARGV[9]) then return {-1, seq - nxt + 1} end
seq = seq + 1
redis.call('SET', KEYS[2], seq, 'EX', ARGV[10])
-- The sender's gaps: seqs below its last stored one that were never stored, at most GAPS_KEPT
-- back from it (a resend older than that counts as stored, as every resend below the last did).
local kept = {}
local top = math.max(last, cs)
for g in string.gmatch(gaps, '%d+') do
  g = tonumber(g)
  if g ~= cs and g > top - GAPS_KEPT then kept[#kept + 1] = g end
end
if cs > last then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  for g = math.max(last + 1, cs - GAPS_KEPT + 1), cs - 1 do kept[#kept + 1] = g end
end
if #kept > 0 then
  redis.call('HSET', KEYS[1], gaps_field, table.concat(kept, ' '))
elseif gaps ~= '' then
  redis.call('HDEL', KEYS[1], gaps_field)
end
local prev = redis.call('HGET', KEYS[5], 'voice') or ARGV[4]
redis.call('HSET', KEYS[5], 'voice', ARGV[4])
local from = redis.call('HGET', KEYS[5], 'switch_from')
local line = tonumber(redis.call('HGET', KEYS[5], 'switch_line') or '0')
local lines = tonumber(redis.call('HGET', KEYS[5], 'switch_lines') or ARGV[13])
if prev ~= ARGV[4] then
  if from == ARGV[4] and line > 0 and line < lines then
    line = lines - line
  else
    line = 0
    lines = tonumber(ARGV[13])
  end
  from = prev
end
local extra = {}
if from then
  extra = {'switch_from', from, 'switch_line', line, 'switch_lines', lines}
  if line + 1 >= lines then
    redis.call('HDEL', KEYS[5], 'switch_from', 'switch_line', 'switch_lines')
  else
    redis.call('HSET', KEYS[5], 'switch_from', from, 'switch_line', line + 1, 'switch_lines', lines)
  end
end
if ARGV[14] ~= '' then
  extra[#extra + 1] = 'lexicon'
  extra[#extra + 1] = ARGV[14]
end
local audience = {}
if (ARGV[15] or '') ~= '' then
  audience = {'to', ARGV[15]}
  extra[#extra + 1] = 'to'
  extra[#extra + 1] = ARGV[15]
end
if ARGV[16] == '1' then
  extra[#extra + 1] = 'open'
  extra[#extra + 1] = ARGV[2]
end
"""
"""Numbering, dedupe, back-pressure and the voice switch: shared with the cluster's ``say``
(voxroom/store/cluster/ingress.py), which differs only in what it writes after."""


def _open_line(key: int) -> str:
    """An open line's first piece (part 0: the ``say``'s own text) in its pieces stream ``KEYS[key]``."""
    return f"""\
if ARGV[16] == '1' then
  redis.call('DEL', KEYS[{key}])
  redis.call('XADD', KEYS[{key}], '*', 'part', 0, 'text', ARGV[3], 'offset', 0, 'end', ARGV[17], 'utt', seq)
  redis.call('EXPIRE', KEYS[{key}], ARGV[10])
end
"""


SINGLE = BODY + _open_line(8) + """\
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', 'seq', seq, 'text', ARGV[3], 'voice', ARGV[4],
           'sender', ARGV[1], 'client_seq', ARGV[2], 'time', ARGV[5], unpack(audience))
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[7], '*', 'room', ARGV[8], 'seq', seq, 'text', ARGV[3],
           'voice', ARGV[4], 'prev_voice', prev, 'sender', ARGV[1], 'time', ARGV[5], unpack(extra))
redis.call('EXPIRE', KEYS[1], ARGV[10])
redis.call('EXPIRE', KEYS[3], ARGV[10])
redis.call('EXPIRE', KEYS[5], ARGV[10])
redis.call('EXPIRE', KEYS[7], ARGV[10])
redis.call('ZADD', KEYS[6], ARGV[5], ARGV[8])
local stale = redis.call('ZRANGEBYSCORE', KEYS[6], '-inf', '(' .. ARGV[11], 'LIMIT', 0, ARGV[12])
if #stale > 0 then redis.call('ZREM', KEYS[6], unpack(stale)) end
redis.call('EXPIRE', KEYS[6], ARGV[10])
return {1, seq}
"""
# Why the script reads the way it does:
# - ``:seq`` missing while ``:state`` is not: ``:state`` outlives ``:seq`` when the worker's last
#   publish came after the last ``say`` (it refreshes ``:state``, not ``:seq``). Numbering then
#   continues where playback stands (``next - 1``), never below it, or the new line would wait
#   forever behind a ``next`` it can never reach.
# - ``:state`` missing while ``:seq`` is not (every accepted line writes ``voice``, so a ``:state``
#   without it was lost: evicted under ``maxmemory``, see docker-compose.yml): the room starts
#   over from its last number (``next = seq + 1``; lines still pending from before are dropped as
#   stale by the worker) instead of answering ``busy`` until ``:seq`` expires.
# - ``EXPIRE`` on ``:out`` before the worker ever wrote it is a no-op; the worker refreshes it.
# - ``vx:rooms`` itself expires when no line was accepted anywhere for the TTL: then every entry
#   in it is stale, and no later ``say`` may ever come to remove them.
# - Voice switches span lines: a switch's progress (``switch_from``, the next ``switch_line``,
#   ``switch_lines``) lives in ``:state`` until its last line is handed out, and each of its
#   lines carries the same three fields in ``vx:jobs`` (the worker blends line k of L over
#   ``k/L..(k+1)/L``). Numbered here, in room order, because a room's lines may be synthesized
#   at once on different workers: none of them could read "how far has the switch got" then.
#   ``prev_voice`` stays for workers from before (they switch within the line).
# - A switch while another runs starts from the voice the room was moving to (the sound jumps
#   from the blend reached to the first step of the new path), except a switch back to the voice
#   the running switch came from: that path is the same one reversed, so it goes on from where
#   it stands (line ``lines - line``) with no jump at all.
# - A line's own lexicon (``say``'s ``lexicon``, voxroom/voices/line_lexicon.py) rides in ``vx:jobs`` as
#   one JSON field, only when given: the worker that synthesizes the line needs it, the room's
#   log does not. A worker from before ignores the field and speaks the line without it.
# - A private line's audience (``say``'s ``to``) is in the room's log too (``voxroom room`` marks
#   the line private and leaves its text out) and in the job, whose worker writes it on every
#   output entry of the line: gateways deliver those to the audience only. It rides in ``extra``
#   (Lua's ``unpack`` spreads only a call's last argument).
# - An open line (``say`` with ``open``) carries ``open``: its sender's ``say`` seq, which names its
#   pieces stream (keys.open_line) for the worker; its first piece (part 0, the ``say``'s text) is
#   written there in the same script, so the stream exists from the moment the line is accepted.

# KEYS: 1 senders, 2 seq, 3 utt, 4 out, 5 state, 6 the open line's pieces (one slot: the room's).
# ARGV: as :data:`SINGLE`'s (the body reads 1, 2, 4, 9, 10, 13, 14), except 7: an epoch for a new
# ``:state``, 11: the room's shard for a new ``:state``; 12 unused.
# Returns {1, seq, epoch, handed, shard, the :utt entry's field pairs...} when accepted.
CLUSTER = BODY + _open_line(6) + """\
local fields = {'seq', seq, 'text', ARGV[3], 'voice', ARGV[4], 'prev_voice', prev,
                'sender', ARGV[1], 'client_seq', ARGV[2], 'time', ARGV[5], unpack(extra)}
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[6], '*', unpack(fields))
if redis.call('HEXISTS', KEYS[5], 'epoch') == 0 then
  redis.call('HSET', KEYS[5], 'epoch', ARGV[7], 'handed', seq - 1, 'shard', ARGV[11])
end
local st = redis.call('HMGET', KEYS[5], 'epoch', 'handed', 'shard')
redis.call('EXPIRE', KEYS[1], ARGV[10])
redis.call('EXPIRE', KEYS[3], ARGV[10])
redis.call('EXPIRE', KEYS[5], ARGV[10])
redis.call('EXPIRE', KEYS[4], ARGV[10])
return {1, seq, st[1], tonumber(st[2]), tonumber(st[3]), unpack(fields)}
"""
# Why: ``:utt`` holds what the job needs (prev_voice, the switch fields, the lexicon), so a line
# can be handed again from it alone. ``handed`` starts just below the room's first line in a new
# ``:state``: when ``:state`` was lost and ``:seq`` was not, the lines before are stale anyway
# (the worker drops them, ``next`` starts over past them) and must not be handed again.
