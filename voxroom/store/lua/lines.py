"""The scripts of an open line's pieces (``say`` with ``open``, docs/protocol.md "Lines streamed
in"): ``append`` and ``flush`` from the gateway, ``close_idle`` from the worker.

The pieces live in one stream per line (``keys.open_line``), in the room's slot; its first entry
(part 0, the ``say``'s own text) is written by the ``say`` script. Every entry has ``part`` (the
last part number it follows), ``offset`` and ``end`` (where its text starts and ends in the line's
whole text, in code points), and ``text``; the one that closes the line has ``final``, a flush has
``flush``. So the stream's last entry alone says where the line stands: its part, its length,
whether it is closed.

Each write also appends a ``piece`` notice to the room's ``:out`` (no ``seq``: no client gets it,
no resume scan stops at it) and rings the room's bell on a cluster: the worker speaking the line
waits on ``:out`` through its one stream watcher, as for its turn, and never polls.

The mode's fence prelude (voxroom/store/lua/room.py ``SINGLE``/``CLUSTER``) gives ``ring``.
"""

from __future__ import annotations

_LAST = """
local function last_piece(key)
  local e = redis.call('XREVRANGE', key, '+', '-', 'COUNT', 1)[1]
  if not e then return nil end
  local f = {id = e[1]}
  for i = 1, #e[2], 2 do f[e[2][i]] = e[2][i + 1] end
  return f
end
local function notice(out, ttl)
  redis.call('XADD', out, '*', 'kind', 'piece')
  redis.call('EXPIRE', out, ttl)
  ring(out)
end
"""

APPEND = _LAST + """
-- KEYS: 1 the line's pieces, 2 the room's output. ARGV: 1 part, 2 text, 3 final ('1'), 4 the
-- text's length in code points, 5 the line's most code points, 6 its most entries, 7 ttl.
-- Returns {1, offset} stored; {0, last part} a part already taken (duplicate: nothing written);
-- {-1} no such line (never opened, or ended and gone); {-2, last part} a gap (part > last + 1);
-- {-3, last part} the line is closed; {-4, its length} the text would pass the line's bound;
-- {-5} too many pieces.
local last = last_piece(KEYS[1])
if not last then return {-1} end
local part, lastpart = tonumber(ARGV[1]), tonumber(last.part)
if part <= lastpart then return {0, lastpart} end
if last.final then return {-3, lastpart} end
if part > lastpart + 1 then return {-2, lastpart} end
local offset = tonumber(last['end'])
if offset + tonumber(ARGV[4]) > tonumber(ARGV[5]) then return {-4, offset} end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[6]) then return {-5} end
local fields = {'part', part, 'text', ARGV[2], 'offset', offset, 'end', offset + tonumber(ARGV[4])}
if ARGV[3] == '1' then fields[#fields + 1] = 'final'; fields[#fields + 1] = '1' end
redis.call('XADD', KEYS[1], '*', unpack(fields))
redis.call('EXPIRE', KEYS[1], ARGV[7])
notice(KEYS[2], ARGV[7])
return {1, offset}
"""

FLUSH = _LAST + """
-- KEYS: 1 the line's pieces, 2 the room's output. ARGV: 1 the line's most entries, 2 ttl.
-- Returns {1, last part} (a flush entry written: the worker speaks what it holds now and answers
-- ``flushed`` with that part once it is published), {-1} no such line, {-5} too many pieces.
local last = last_piece(KEYS[1])
if not last then return {-1} end
if redis.call('XLEN', KEYS[1]) >= tonumber(ARGV[1]) then return {-5} end
redis.call('XADD', KEYS[1], '*', 'part', last.part, 'text', '', 'offset', last['end'], 'end', last['end'],
           'flush', '1')
redis.call('EXPIRE', KEYS[1], ARGV[2])
notice(KEYS[2], ARGV[2])
return {1, tonumber(last.part)}
"""

CLOSE_IDLE = _LAST + """
-- KEYS: 1 the line's pieces, 2 the room's output. ARGV: 1 the id of the last entry the worker
-- read, 2 ttl. The line idle past VOXROOM_OPEN_LINE_IDLE_S is closed as if its sender had sent
-- ``final``, unless a piece came meanwhile (then nothing is written: the worker reads it).
-- Returns 1 (closed), 0 (a piece came, or it is closed already).
local last = last_piece(KEYS[1])
if not last or last.id ~= ARGV[1] or last.final then return 0 end
redis.call('XADD', KEYS[1], '*', 'part', last.part, 'text', '', 'offset', last['end'], 'end', last['end'],
           'final', '1', 'idle', '1')
redis.call('EXPIRE', KEYS[1], ARGV[2])
notice(KEYS[2], ARGV[2])
return 1
"""
