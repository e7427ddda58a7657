-- rw_status.lua: describe a read-write lock without revealing any token.
--
-- KEYS[1]  lock key
-- KEYS[2]  meta key
-- KEYS[3]  readers
-- KEYS[4]  writers
--
-- Reply: {write_held, pttl, label, fence, since_ms, last_fence, readers, writers}
--   write_held..last_fence  as mutex_status.lua, about the writer
--   readers                 live read shares
--   writers                 live waiting-writer registrations
--
-- Read-only: lapsed entries are not counted, not pruned.
local current = redis.call('GET', KEYS[1])
local fence, since, token, label = parse_meta(redis.call('GET', KEYS[2]))
local last = fence and string.format('%.0f', fence) or false
local now = server_ms()
local readers = redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')
local writers = redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf')
if not current then
  return {0, -2, false, false, false, last, readers, writers}
end
local pttl = redis.call('PTTL', KEYS[1])
if token == current then
  return {1, pttl, label, last, since, last, readers, writers}
end
return {1, pttl, false, false, false, last, readers, writers}
