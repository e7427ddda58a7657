-- mutex_release.lua: compare-and-delete the plain mutex — or hand it straight to the
-- next registered waiter — and, for a waiter that gives up, leave its registration.
--
-- KEYS[1]  lock key
-- KEYS[2]  counter       the fencing counter of the lock's hash slot (see mark.lua)
-- KEYS[3]  floor         its floor
-- KEYS[4]  waiters       {<lock key>}:q: "<id><kind><token>" -> registration deadline
-- ARGV[1]  token         the holder's token
-- ARGV[2]  channel       wake-up channel of this lock
-- ARGV[3]  publish       'PUBLISH' (standalone) or 'SPUBLISH' (cluster)
-- ARGV[4]  claim_ms      how long a handed lock holds before its new holder extends it
-- ARGV[5]  registration  this acquisition's registration ("<id><kind><token>") to leave,
--                        or '' when it never registered
--
-- Reply:  1  released (or handed over) by this call
--        -1  the lock is free: an earlier attempt of this release succeeded (its reply
--            was lost), or the lease ran out, or the key was deleted
--         0  the token does not hold the lock, which another token holds; nothing was
--            changed (but the registration left)
--
-- Without registered waiters: GET, EXISTS, UNLINK. Otherwise the first live registered
-- waiter (earliest deadline) of kind ' ' gets the lock with its own token for claim_ms
-- and a fresh fencing token, told by a message "g <id> <fence>" on the channel: it holds
-- the lock when it reads it, one hop after this release instead of a wake-up and an
-- acquire. A first waiter of kind '!' (one that must acquire by itself) is woken with
-- '1' instead, and the lock deleted. Dead registrations (past their deadline) are
-- pruned first.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  if redis.call('EXISTS', KEYS[4]) == 0 then
    redis.call('UNLINK', KEYS[1])
    return 1
  end
  if ARGV[5] ~= '' then
    redis.call('ZREM', KEYS[4], ARGV[5])
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  local waiter = redis.call('ZRANGE', KEYS[4], 0, 0)[1]
  if waiter and string.sub(waiter, 17, 17) == ' ' then
    local fence = take_fence(KEYS[2], KEYS[3])
    if type(fence) == 'table' then
      return fence
    end
    redis.call('ZREM', KEYS[4], waiter)
    redis.call('SET', KEYS[1], string.sub(waiter, 18), 'PX', ARGV[4])
    redis.call(ARGV[3], ARGV[2], string.format('g %s %.0f', string.sub(waiter, 1, 16), fence))
    return 1
  end
  redis.call('UNLINK', KEYS[1])
  if waiter then
    redis.call(ARGV[3], ARGV[2], '1')
  end
  return 1
end
if ARGV[5] ~= '' then
  redis.call('ZREM', KEYS[4], ARGV[5])
end
if current then
  return 0
end
return -1
