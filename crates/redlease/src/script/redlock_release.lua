-- redlock_release.lua: compare-and-delete a Redlock's key on one of its masters, and
-- wake a waiter.
--
-- KEYS[1]  lock key
-- ARGV[1]  token         the holder's token
-- ARGV[2]  channel       wake-up channel of this lock
-- ARGV[3]  publish       'PUBLISH' (standalone) or 'SPUBLISH' (cluster)
--
-- Reply:  1  released by this call
--        -1  the key is free (an earlier attempt succeeded, or the lease ran out)
--         0  another token holds it; nothing was changed
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('UNLINK', KEYS[1])
  redis.call(ARGV[3], ARGV[2], '1')
  return 1
end
if current then
  return 0
end
return -1
