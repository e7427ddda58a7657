-- fence.lua: shared prelude of the scripts that issue fencing tokens or read metadata.
--
-- A lock's metadata is one string, "<fence> <since_ms> <token> <label>", stored at
-- {<lock key>}:meta with the lease's TTL plus a retention period, so the fencing
-- high-water mark outlives the lock. One SET writes it; one GET reads it.
--
-- A fencing token must be strictly greater than every token issued before for the same
-- lock, even when the metadata expired, was deleted, or came back older from a
-- snapshot. So the next token is max(prev + 1, Redis server time in microseconds): a
-- missing or stale mark starts again from Redis's own clock (TIME), never the client's.
-- Tokens stay below 2^53, so Lua's doubles hold them exactly.
--
-- Everything here is on the hot path of every acquisition, so it works on the strings
-- TIME returns instead of formatting numbers (a number-to-string conversion costs more
-- than a SET), and reads the previous mark in the same SET that writes the new one.

-- parse_meta(value) -> fence, since_ms, token, label   (all nil when absent/garbled)
local function parse_meta(value)
  if not value then
    return nil
  end
  local fence, since, token, label = string.match(value, '^(%d+) (%d+) (%S+) ?(.*)$')
  return tonumber(fence), since, token, label
end

-- next_fence(prev) -> fence, now_ms   (numbers; for the rarer paths)
local function next_fence(prev)
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  prev = prev or 0
  if prev >= 9007199254740990 then
    error({err = 'ERR redlease fencing mark exhausted'})
  end
  return math.max(prev + 1, now_us), math.floor(now_us / 1000)
end

-- issue_fence(meta_key, tail, px) -> fence (a decimal string), or an error reply when
-- the metadata key holds another type (nothing written then)
--
-- Writes the metadata of a new holding — tail is " <token> <label>" — and returns its
-- fencing token: Redis time in microseconds, unless the previous mark is not below it
-- (a clock that stepped back, or two acquisitions in one microsecond), then the
-- previous mark plus one. The previous mark is read by the SET that writes the new one.
local function issue_fence(meta, tail, px)
  local t = redis.call('TIME')
  local us = string.sub('00000' .. t[2], -6)
  local fence = t[1] .. us
  local prev = redis.pcall('SET', meta, fence .. ' ' .. t[1] .. string.sub(us, 1, 3) .. tail,
    'PX', px, 'GET')
  if type(prev) == 'table' then
    return prev
  end
  if prev then
    local space = string.find(prev, ' ', 1, true)
    local p = space and tonumber(string.sub(prev, 1, space - 1))
    if p and p >= tonumber(fence) then
      if p >= 9007199254740990 then
        error({err = 'ERR redlease fencing mark exhausted'})
      end
      fence = string.format('%.0f', p + 1)
      redis.call('SET', meta, fence .. ' ' .. t[1] .. string.sub(us, 1, 3) .. tail, 'PX', px)
    end
  end
  return fence
end

