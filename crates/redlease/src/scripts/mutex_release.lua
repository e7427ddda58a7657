-- mutex_release.lua: compare-and-delete the plain mutex and wake one waiter.
--
-- KEYS[1]  lock key
-- KEYS[2]  meta key
-- ARGV[1]  token         the holder's token
-- ARGV[2]  channel       wake-up channel of this lock
-- ARGV[3]  publish       'PUBLISH' (standalone) or 'SPUBLISH' (cluster)
-- ARGV[4]  retention_ms  how long the meta hash outlives the release
--
-- Reply: 1  released by this call, or by an earlier attempt of the same release whose
--           reply was lost (the meta hash remembers the token as released)
--        0  the token does not hold the lock; nothing was changed
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('HSET', KEYS[2], 'released', '1')
  redis.call('PEXPIRE', KEYS[2], ARGV[4])
  redis.call(ARGV[3], ARGV[2], '1')
  return 1
end
if not current then
  local meta = redis.call('HMGET', KEYS[2], 'token', 'released')
  if meta[1] == ARGV[1] and meta[2] then
    return 1
  end
end
return 0
