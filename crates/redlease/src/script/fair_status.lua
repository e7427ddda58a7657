-- fair_status.lua: describe a fair mutex and its queue without revealing any token.
--
-- KEYS[1]  lock key
-- KEYS[2]  counter       the fencing counter of the lock's hash slot (see mark.lua)
-- KEYS[3]  floor         its floor
-- KEYS[4]  queue
-- KEYS[5]  alive
--
-- Reply: {held, pttl, label, false, false, mark, waiting, labels}
--   held..mark  as mutex_status.lua (the holder's own fencing token and since when it
--               holds are not recorded)
--   waiting     live entries in the queue
--   labels      owner labels of the first 100 live entries, in order of service
--
-- Read-only: dead entries are skipped, not dropped.
local current = redis.call('GET', KEYS[1])
local mark = fence_mark(KEYS[2], KEYS[3]) or false
local now = server_ms()
local waiting = redis.call('ZCOUNT', KEYS[5], '(' .. now, '+inf')
local labels = {}
local members = redis.call('ZRANGE', KEYS[4], 0, 99)
if #members > 0 then
  local deadlines = redis.call('ZMSCORE', KEYS[5], unpack(members))
  for i, member in ipairs(members) do
    if deadlines[i] and tonumber(deadlines[i]) > now then
      -- "<32 hex id><32 hex>@<label>"
      labels[#labels + 1] = string.sub(member, 66)
    end
  end
end
if not current then
  return {0, -2, false, false, false, mark, waiting, labels}
end
local label = false
if string.find(current, '^%x+@') == 1 and string.find(current, '@', 1, true) == 33 then
  label = string.sub(current, 34)
end
return {1, redis.call('PTTL', KEYS[1]), label, false, false, mark, waiting, labels}
