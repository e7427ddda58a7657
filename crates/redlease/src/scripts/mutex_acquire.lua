-- mutex_acquire.lua: take the plain mutex if it is free, or confirm we already hold it.
--
-- KEYS[1]  lock key      <prefix><name>: the holder's token as a plain string with a PX
--                        TTL (the format of redis-py's Lock, node-redlock and redsync)
-- KEYS[2]  meta key      {<lock key>}:meta: hash {fence, token, label, since_ms[, released]};
--                        lives for the lease plus retention_ms, so the fencing mark
--                        outlives the lock
-- ARGV[1]  token         this acquisition's random token
-- ARGV[2]  ttl_ms        lease length in milliseconds
-- ARGV[3]  label         human label of the owner, such as host:pid
-- ARGV[4]  retention_ms  how long the meta hash outlives the lease
--
-- Reply: {1, fence, pttl}  acquired now, or already ours: a retry after a lost reply
--                          finds its own token and gets the fence it was given
--        {0, pttl}         held by someone else; pttl is its remaining TTL (-1: none)
--
-- Every read that can fail (WRONGTYPE) happens before the first write, so an error
-- leaves everything untouched.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  local fence = tonumber(redis.call('HGET', KEYS[2], 'fence')) or 0
  return {1, fence, redis.call('PTTL', KEYS[1])}
end
if current then
  return {0, redis.call('PTTL', KEYS[1])}
end
local fence, now_ms = next_fence(KEYS[2])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
redis.call('HSET', KEYS[2], 'fence', string.format('%.0f', fence), 'token', ARGV[1],
  'label', ARGV[3], 'since_ms', string.format('%.0f', now_ms))
redis.call('HDEL', KEYS[2], 'released')
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[2]) + tonumber(ARGV[4]))
return {1, fence, tonumber(ARGV[2])}
