-- redlock_acquire.lua: take the lock key on one Redlock master, or confirm we hold it.
--
-- KEYS[1]  lock key   <prefix><name>: the holder's token with a PX TTL, exactly the
--                     format of node-redlock's and redsync's Redlock (and of the plain
--                     mutex, so they exclude each other too)
-- ARGV[1]  token      this acquisition's random token
-- ARGV[2]  ttl_ms     lease length in milliseconds
--
-- Reply: 1          acquired now, for the full ttl_ms
--        {1, pttl}  already ours: a retry after a lost reply, or a claim of an earlier
--                   round that was not given back; pttl is what is left
--        {0, pttl}  held by someone else; pttl is its remaining TTL (-1: none)
--
-- No fencing metadata is written: a Redlock gives no fencing token (see redlock.rs).
-- Release and renewal use redlock_release.lua and mutex_extend.lua.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  return 1
end
local pttl = redis.call('PTTL', KEYS[1])
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return {1, pttl}
end
return {0, pttl}
