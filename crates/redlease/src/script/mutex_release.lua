-- mutex_release.lua: compare-and-delete the plain mutex and wake one waiter.
--
-- KEYS[1]  lock key
-- KEYS[2]  meta key
-- ARGV[1]  token     the holder's token
-- ARGV[2]  channel   wake-up channel of this lock
-- ARGV[3]  publish   'PUBLISH' (standalone) or 'SPUBLISH' (cluster)
--
-- Reply:  1  released by this call
--        -1  the lock is free and this token was its last holder: an earlier attempt
--            of this release succeeded (its reply was lost), or the lease expired
--         0  the token does not hold the lock: it is held by another token, or free
--            after another holder; nothing was changed
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  redis.call('UNLINK', KEYS[1])
  redis.call(ARGV[3], ARGV[2], '1')
  return 1
end
if current then
  return 0
end
-- The metadata is "<fence> <since_ms> <token> <label>".
local meta = redis.call('GET', KEYS[2])
if meta and string.find(meta, ' ' .. ARGV[1] .. ' ', 1, true) then
  return -1
end
return 0
