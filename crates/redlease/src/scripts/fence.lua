-- fence.lua: shared prelude of every script that issues fencing tokens.
--
-- next_fence(meta_key) -> fence, now_ms
--
-- A fencing token must be strictly greater than every token issued before for the
-- same lock, even when the metadata hash that stores the high-water mark expired, was
-- deleted, or came back older from a snapshot. So the next token is
-- max(stored + 1, Redis server time in microseconds): a missing or stale mark is
-- reseeded from Redis's own clock (TIME), never the client's. The caller stores the
-- new mark. Tokens stay below 2^53, so Lua's doubles hold them exactly.
local function next_fence(meta_key)
  local t = redis.call('TIME')
  local now_us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  local prev = tonumber(redis.call('HGET', meta_key, 'fence')) or 0
  if prev >= 9007199254740990 then
    error({err = 'ERR redlease fencing mark of ' .. meta_key .. ' is exhausted'})
  end
  return math.max(prev + 1, now_us), math.floor(now_us / 1000)
end

