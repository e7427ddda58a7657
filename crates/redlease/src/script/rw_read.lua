-- rw_read.lua: take a read share of the read-write lock if no writer holds it or
-- waits for it (writer-preferring).
--
-- KEYS[1]  lock key   <prefix><name>: the writer's token with a PX TTL while write-held
--                     (the plain mutex format: a plain mutex holder also keeps readers out)
-- KEYS[2]  readers    {<lock key>}:readers: reader token -> lease deadline (Redis ms)
-- KEYS[3]  writers    {<lock key>}:writers: waiting writer token -> registration deadline
-- ARGV[1]  token      this share's random token
-- ARGV[2]  ttl_ms     lease length
--
-- Reply: 1                  acquired now, for the full ttl_ms
--        {1, remaining_ms}  already ours: a retry after a lost reply
--        {0, remaining_ms}  a writer holds the lock (remaining: its lease) or waits for
--                           it (remaining: until the last registration lapses unless it
--                           is renewed); -1 when unknown
--
-- Five calls when no writer holds or waits.
local now = server_ms()
local blocked = false
if redis.call('EXISTS', KEYS[1], KEYS[3]) > 0 then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    blocked = true
  else
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
    blocked = redis.call('EXISTS', KEYS[3]) == 1
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if blocked then
  local mine = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if mine then
    return {1, tonumber(mine) - now}
  end
  local pttl = redis.call('PTTL', KEYS[1])
  if pttl >= 0 then
    return {0, pttl}
  end
  local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
  if last[2] then
    return {0, tonumber(last[2]) - now}
  end
  return {0, -1}
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[2]), ARGV[1])
expire_at_least(KEYS[2], ARGV[2])
return 1
