-- sem_acquire.lua: take `count` permits of a semaphore if that many are free.
--
-- KEYS[1]  permits   <prefix><name>: sorted set "<token>:<i>" -> lease deadline (Redis
--                    ms), one member per permit held; the set's TTL covers its latest
--                    deadline
-- KEYS[2]  limit     {<key>}:limit: the permit limit, fixed while any permit is held
-- ARGV[1]  token     this acquisition's random token
-- ARGV[2]  count     permits wanted (1..limit)
-- ARGV[3]  limit     the caller's permit limit
-- ARGV[4]  ttl_ms    lease length
--
-- Reply: 1                        acquired now, for the full ttl_ms
--        {1, remaining_ms}        already ours: a retry after a lost reply
--        {0, remaining_ms, free}  not enough free permits. remaining: until the earliest
--                                 held permit lapses unless renewed (-1: unknown);
--                                 free: permits free right now (fewer than count)
--        {-1, limit}              permits are held under another limit (the stored one);
--                                 nothing was changed
--
-- Permits whose deadline passed (their holder stopped renewing) are pruned first, so a
-- crashed holder's permits come back within their TTL. When no permit is held, the
-- caller's limit becomes the limit. Seven calls when permits are free.
local stored = redis.call('GET', KEYS[2])
local now = server_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local used = redis.call('ZCARD', KEYS[1])
if stored and stored ~= ARGV[3] and used > 0 then
  return {-1, stored}
end
local count, limit = tonumber(ARGV[2]), tonumber(ARGV[3])
if used + count > limit then
  local mine = redis.call('ZSCORE', KEYS[1], ARGV[1] .. ':1')
  if mine then
    return {1, tonumber(mine) - now}
  end
  local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
  return {0, first[2] and (tonumber(first[2]) - now) or -1, math.max(limit - used, 0)}
end
local deadline = now + tonumber(ARGV[4])
local args = {}
for i = 1, count do
  args[2 * i - 1] = deadline
  args[2 * i] = ARGV[1] .. ':' .. i
end
redis.call('ZADD', KEYS[1], unpack(args))
if used == 0 then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
else
  expire_at_least(KEYS[1], ARGV[4])
end
if stored == ARGV[3] then
  expire_at_least(KEYS[2], ARGV[4])
else
  redis.call('SET', KEYS[2], ARGV[3], 'PX', ARGV[4])
end
return 1
