-- mutex_status.lua: describe a plain mutex without revealing its token.
--
-- KEYS[1]  lock key
-- KEYS[2]  meta key
--
-- Reply: {held, pttl, label, fence, since_ms, last_fence}
--   held        1 if the lock key exists, else 0
--   pttl        remaining TTL in ms (-1: no TTL, -2: not held)
--   label       the holder's label, or false when the holder is not a redlease client
--   fence       the holder's fencing token, or false when unknown
--   since_ms    server time (ms) of the acquisition, or false when unknown
--   last_fence  the highest fencing token issued for this lock, or false
local current = redis.call('GET', KEYS[1])
local fence, since, token, label = parse_meta(redis.call('GET', KEYS[2]))
local last = fence and string.format('%.0f', fence) or false
if not current then
  return {0, -2, false, false, false, last}
end
local pttl = redis.call('PTTL', KEYS[1])
if token == current then
  return {1, pttl, label, last, since, last}
end
return {1, pttl, false, false, false, last}
