-- sem_status.lua: describe a semaphore without revealing any token.
--
-- KEYS[1]  permits   <prefix><name>
-- KEYS[2]  limit     {<key>}:limit
-- KEYS[3]  waiters   {<key>}:waiters
--
-- Reply: {limit, in_use, next_lapse_ms, waiting}
--   limit          the limit in force (false when no permit is held)
--   in_use         permits held with a live lease
--   next_lapse_ms  until the earliest live permit lapses unless renewed (-1: none)
--   waiting        live registrations: acquisitions waiting for permits
--
-- Read-only: lapsed permits are not counted, not pruned.
local stored = redis.call('GET', KEYS[2])
local now = server_ms()
local in_use = redis.call('ZCOUNT', KEYS[1], '(' .. now, '+inf')
local first = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local lapse = -1
if first[2] then
  lapse = tonumber(first[2]) - now
end
return {stored or false, in_use, lapse, redis.call('ZCOUNT', KEYS[3], '(' .. now, '+inf')}
