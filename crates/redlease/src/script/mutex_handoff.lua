-- mutex_handoff.lua: pass the plain mutex from its holder straight to the next holder,
-- in one step: the lock never becomes free, so nobody can slip in between, and the
-- next holder gets a fresh token, lease and fencing token without a round trip of its
-- own. Used when the next waiter is a task of the same client.
--
-- KEYS[1]  lock key
-- KEYS[2]  counter       the fencing counter of the lock's hash slot (see mark.lua)
-- KEYS[3]  floor         its floor
-- ARGV[1]  old token     the current holder's token
-- ARGV[2]  new token     the next holder's token
-- ARGV[3]  ttl_ms        how long the lock holds for the next holder before it extends
--                        it (its claim window; its whole lease if it does not renew)
--
-- Reply: fence            (an integer) handed over now, for ttl_ms
--        {1, fence, pttl}  already handed over — a retry after a lost reply — with a
--                          fresh fencing token and what is left
--        0                 the old token does not hold the lock; nothing was changed
local current = redis.call('GET', KEYS[1])
if current == ARGV[2] then
  local fence = take_fence(KEYS[2], KEYS[3])
  if type(fence) == 'table' then
    return fence
  end
  return {1, fence, redis.call('PTTL', KEYS[1])}
end
if current ~= ARGV[1] then
  return 0
end
-- The fencing token first: a counter key of another type fails the call with nothing
-- written.
local fence = take_fence(KEYS[2], KEYS[3])
if type(fence) == 'table' then
  return fence
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return fence
