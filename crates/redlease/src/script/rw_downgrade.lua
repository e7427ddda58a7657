-- rw_downgrade.lua: turn the write lock into a read share in one step, so no other
-- writer can get in between.
--
-- KEYS[1]  lock key
-- KEYS[2]  readers         {<lock key>}:readers
-- KEYS[3]  writers         {<lock key>}:writers
-- ARGV[1]  writer token    the write lock's token
-- ARGV[2]  reader token    the new share's random token
-- ARGV[3]  ttl_ms          the share's lease length
-- ARGV[4]  publish         'PUBLISH' or 'SPUBLISH'
-- ARGV[5]  reader channel  {<lock key>}:wake:read
--
-- Reply: 1  the writer is now a reader (also for a retry that finds the share taken)
--        0  the writer token does not hold the lock; nothing was changed
--
-- Other readers are woken unless a writer waits (writer preference still holds).
local now = server_ms()
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  local deadline = redis.call('ZSCORE', KEYS[2], ARGV[2])
  if deadline and tonumber(deadline) > now then
    return 1
  end
  return 0
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[3]), ARGV[2])
expire_at_least(KEYS[2], ARGV[3])
redis.call('DEL', KEYS[1])
local waiting = redis.call('EXISTS', KEYS[3]) == 1
if waiting then
  redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
  waiting = redis.call('EXISTS', KEYS[3]) == 1
end
if not waiting then
  redis.call(ARGV[4], ARGV[5], '*')
end
return 1
