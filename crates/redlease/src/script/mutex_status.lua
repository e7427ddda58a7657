-- mutex_status.lua: describe a plain mutex without revealing its token.
--
-- KEYS[1]  lock key
-- KEYS[2]  counter       the fencing counter of the lock's hash slot (see mark.lua)
-- KEYS[3]  floor         its floor
--
-- Reply: {held, pttl, label, false, false, mark}
--   held   1 if the lock key exists, else 0
--   pttl   remaining TTL in ms (-1: no TTL, -2: not held)
--   label  the holder's owner label (what follows the '@' of a redlease token), or
--          false when the holder is not a redlease client
--   mark   the slot's fencing mark: every fencing token issued so far for this lock is
--          at most this, every later one above (false when unknown)
-- (The fourth and fifth elements — the holder's own fencing token and since when it
-- holds — are not recorded for the plain mutex.)
local current = redis.call('GET', KEYS[1])
local mark = fence_mark(KEYS[2], KEYS[3]) or false
if not current then
  return {0, -2, false, false, false, mark}
end
return {1, redis.call('PTTL', KEYS[1]), plain_owner(current) or false, false, false, mark}
