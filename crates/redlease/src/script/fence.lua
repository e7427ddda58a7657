-- fence.lua: shared prelude of the scripts that issue fencing tokens or read metadata.
--
-- A lock's metadata is one string, "<fence> <since_ms> <token> <label>", stored at
-- {<lock key>}:meta with the lease's TTL plus a retention period, so the fencing
-- high-water mark outlives the lock. One SET writes it; one GET reads it.
--
-- parse_meta(value) -> fence, since_ms, token, label   (all nil when absent/garbled)
local function parse_meta(value)
  if not value then
    return nil
  end
  local fence, since, token, label = string.match(value, '^(%d+) (%d+) (%S+) ?(.*)$')
  return tonumber(fence), since, token, label
end

-- next_fence(prev) -> fence, now_ms
--
-- A fencing token must be strictly greater than every token issued before for the same
-- lock, even when the metadata expired, was deleted, or came back older from a
-- snapshot. So the next token is max(prev + 1, Redis server time in microseconds): a
-- missing or stale mark is reseeded from Redis's own clock (TIME), never the client's.
-- Tokens stay below 2^53, so Lua's doubles hold them exactly.
local function next_fence(prev)
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  prev = prev or 0
  if prev >= 9007199254740990 then
    error({err = 'ERR redlease fencing mark exhausted'})
  end
  return math.max(prev + 1, now_us), math.floor(now_us / 1000)
end

