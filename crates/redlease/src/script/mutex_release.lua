-- mutex_release.lua: compare-and-delete the plain mutex — or hand it straight to the
-- next registered waiter — and, for a waiter that gives up, leave its registration.
--
-- KEYS[1]  lock key
-- KEYS[2]  counter       the fencing counter of the lock's hash slot (see mark.lua)
-- KEYS[3]  floor         its floor
-- KEYS[4]  waiters       {<lock key>}:q: "<id><kind><token>" -> registration deadline;
--                        the lock's wake-up channel is this name with 'wake' for its
--                        final 'q' ({<lock key>}:wake)
-- ARGV[1]  token         the holder's token
-- ARGV[2]  hand-over     '<publish> <claim_ms>': 'PUBLISH' (standalone) or 'SPUBLISH'
--                        (cluster), and how long a handed lock holds before its new
--                        holder extends it
-- ARGV[3]  registration  (only for a waiter that gives up) this acquisition's
--                        registration ("<id><kind><token>") to leave
--
-- Reply:  1  released (or handed over) by this call
--        -1  the lock is free: an earlier attempt of this release succeeded (its reply
--            was lost), or the lease ran out, or the key was deleted
--         0  the token does not hold the lock, which another token holds; nothing was
--            changed (but the registration left)
--
-- Without registered waiters: GET, EXISTS, UNLINK — before anything else, the fencing
-- helpers included (see script/mod.rs), so that the common release pays for nothing
-- more; the arguments only a hand-over needs travel as one. Otherwise the first live
-- registered waiter (earliest deadline) of kind ' ' gets the lock with its own token
-- for claim_ms and a fresh fencing token, told by a message "g <id> <fence> <claim_ms>"
-- on the channel (the claim is this releaser's, which the waiter's handle may not
-- share): it holds the lock when it reads it, one hop after this release instead of a
-- wake-up and an acquire. A first waiter of kind '!' (one that must acquire by itself)
-- is woken with '1' instead, and the lock deleted. Dead registrations (past their
-- deadline) are pruned first.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] and redis.call('EXISTS', KEYS[4]) == 0 then
  redis.call('UNLINK', KEYS[1])
  return 1
end
--[[mark.lua]]
if ARGV[3] then
  redis.call('ZREM', KEYS[4], ARGV[3])
end
if current ~= ARGV[1] then
  if current then
    return 0
  end
  return -1
end
local publish, claim_ms = string.match(ARGV[2], '^(%a+) (%d+)$')
local channel = string.sub(KEYS[4], 1, -2) .. 'wake'
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
  redis.call('SET', KEYS[1], string.sub(waiter, 18), 'PX', claim_ms)
  redis.call(publish, channel, string.format('g %s %.0f %s', string.sub(waiter, 1, 16), fence, claim_ms))
  return 1
end
redis.call('UNLINK', KEYS[1])
if waiter then
  redis.call(publish, channel, '1')
end
return 1
