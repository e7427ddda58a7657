-- fair_status.lua: describe a fair mutex and its queue without revealing any token.
--
-- KEYS[1]  lock key
-- KEYS[2]  meta key
-- KEYS[3]  queue
-- KEYS[4]  alive
--
-- Reply: {held, pttl, label, fence, since_ms, last_fence, waiting, labels}
--   held..last_fence  as mutex_status.lua
--   waiting           live entries in the queue
--   labels            owner labels of the first 100 live entries, in order of service
--
-- Read-only: dead entries are skipped, not pruned.
local current = redis.call('GET', KEYS[1])
local fence, since, token, label = parse_meta(redis.call('GET', KEYS[2]))
local last = fence and string.format('%.0f', fence) or false
local now = server_ms()
local waiting = redis.call('ZCOUNT', KEYS[4], '(' .. now, '+inf')
local labels = {}
local members = redis.call('ZRANGE', KEYS[3], 0, 99)
if #members > 0 then
  local deadlines = redis.call('ZMSCORE', KEYS[4], unpack(members))
  for i, member in ipairs(members) do
    if deadlines[i] and tonumber(deadlines[i]) > now then
      labels[#labels + 1] = string.sub(member, 18)
    end
  end
end
if not current then
  return {0, -2, false, false, false, last, waiting, labels}
end
local pttl = redis.call('PTTL', KEYS[1])
if token == current then
  return {1, pttl, label, last, since, last, waiting, labels}
end
return {1, pttl, false, false, false, last, waiting, labels}
