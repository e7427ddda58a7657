-- mark.lua: shared prelude of the scripts that issue fencing tokens from the fencing
-- mark of a lock's hash slot (the plain mutex).
--
-- A fencing token must be strictly greater than every token issued before for the same
-- lock: also when a key was lost or deleted, when Redis's clock steps back, and after a
-- failover to a replica that missed the last writes. One counter per Redis Cluster hash
-- slot serves every lock in the slot — tokens rising per slot rise per lock — so an
-- acquisition costs one INCR, and no key outlives a released lock:
--
--   counter  {<prefix>fence:<n>}        lives COUNTER_MS from when it was seeded; then
--                                       the next acquisition seeds it again
--   floor    {<prefix>fence:<n>}:floor  above every token the current seed can lead
--                                       to; lives FLOOR_MS from the last seed
--
-- A seed is max(Redis server time in microseconds, floor + 1), and the floor is then
-- seed + COUNTER_MS * 1000, which the counter cannot reach within its life (that would
-- take more than one acquisition per microsecond in one slot). So tokens keep rising
-- across a lost counter, and across a clock that steps back while the floor exists.
-- When the counter simply expires the next seed is the clock again; a counter lost
-- early (deleted, evicted) makes the next seed the floor, up to COUNTER_MS ahead of the
-- clock. Across a failover to a replica that missed the last writes, tokens keep
-- rising when the failover takes longer than twice COUNTER_MS (automatic failovers take
-- seconds): the promoted replica's counter has expired by then, and its clock has
-- passed every token issued. Tokens stay below 2^53, exact in Lua's numbers, for a
-- quarter of a millennium.
local COUNTER_MS = 100
-- Every seed is above this (2^50); a counter below it was made by the plain mutex's
-- pipelined INCR and is not seeded yet.
local SEEDED = 1125899906842624
local FLOOR_MS = 86400000

-- take_fence(counter, floor) -> the next fencing token (a number), or an error reply (a
-- table) when the counter key holds something else; nothing is written then
local function take_fence(counter, floor)
  local fence = redis.pcall('INCR', counter)
  if type(fence) ~= 'number' then
    return fence
  end
  if fence >= 9007199254740990 then
    return {err = 'ERR redlease fencing mark exhausted'}
  end
  if fence > SEEDED then
    return fence
  end
  -- The counter was missing (INCR just made it 1; the plain mutex's pipelined INCR,
  -- which cannot seed it, may have made it a few more): seed it. Every seed is above
  -- 2^50 (Redis time in microseconds is, since 2005).
  local t = redis.call('TIME')
  fence = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local previous = redis.pcall('GET', floor)
  previous = type(previous) == 'string' and tonumber(previous)
  if previous and previous >= fence then
    fence = previous + 1
  end
  redis.call('SET', counter, string.format('%.0f', fence), 'PX', COUNTER_MS)
  redis.call('SET', floor, string.format('%.0f', fence + COUNTER_MS * 1000), 'PX', FLOOR_MS)
  return fence
end

-- fence_mark(counter, floor) -> a decimal string not below any token issued so far in
-- the slot, or nil when that is unknown: the counter while it is seeded, else the floor
-- (a counter that a pipelined INCR made after it expired reads a few units — far below
-- the tokens issued before, which the floor bounds)
local function fence_mark(counter, floor)
  local mark = redis.pcall('GET', counter)
  if type(mark) == 'string' and (tonumber(mark) or 0) > SEEDED then
    return mark
  end
  mark = redis.pcall('GET', floor)
  if type(mark) == 'string' then
    return mark
  end
  return nil
end
