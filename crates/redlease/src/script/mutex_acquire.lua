-- mutex_acquire.lua: take the plain mutex if it is free, or confirm we already hold it;
-- a waiter that finds it held registers, so that a release can hand it the lock.
--
-- KEYS[1]  lock key      <prefix><name>: the holder's token as a plain string with a PX
--                        TTL (the format of redis-py's Lock, node-redlock and redsync);
--                        redlease's tokens are "<32 hex digits>@<owner label>"
-- KEYS[2]  counter       the fencing counter of the lock's hash slot (see mark.lua)
-- KEYS[3]  floor         its floor
-- KEYS[4]  waiters       {<lock key>}:q: "<id><kind><token>" -> registration deadline
--                        (Redis ms), the waiters a release may hand the lock to or wake
-- ARGV[1]  token         this acquisition's token
-- ARGV[2]  ttl_ms        lease length in milliseconds
-- ARGV[3]  id            the waiter's public id (16 hex digits) and kind: ' ' a waiter
--                        a release may hand the lock to, '!' one it may only wake
-- ARGV[4]  wait          '0': only try; '1': register when busy, and leave the
--                        registration when acquired
-- ARGV[5]  register_ms   how long a registration lives without a new attempt
--
-- Reply: fence             (an integer) acquired now, for the full ttl_ms
--        {1, fence, pttl}  already ours — a retry after a lost reply, or a lock a release
--                          handed us — with a fresh fencing token, its TTL extended to
--                          at least ttl_ms, and what is left
--        {0, pttl}         held by someone else; pttl is its remaining TTL (-1: none)
--        {0, pttl, mark, foreign}
--                          the same for a registering waiter, pttl at most half the
--                          registration's life (it must try again before that lapses),
--                          with the slot's fencing mark (a decimal string, false when
--                          none): a hand-over with a higher fence was made after this
--                          attempt ran; foreign is 1 when the holder is not a redlease
--                          plain mutex (its token is not "<32 hex>@<label>", or the key
--                          has no TTL), whose release announces nothing: the waiter polls
--
-- Two calls when the lock is free: SET NX and INCR. Nothing is left half-done: SET NX
-- on a key of another type just fails (the GET that follows raises WRONGTYPE before
-- any write), and a counter key of another type undoes the SET.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = take_fence(KEYS[2], KEYS[3])
  if type(fence) == 'table' then
    redis.call('DEL', KEYS[1])
    return fence
  end
  if ARGV[4] ~= '0' then
    -- Leave a registration this acquisition made: an earlier attempt's, or
    -- this very request's when it is a retry whose first try registered and lost its
    -- reply (left behind, our own release would hand the lock to it).
    redis.call('ZREM', KEYS[4], ARGV[3] .. ARGV[1])
  end
  return fence
end
local current = redis.call('GET', KEYS[1])
local pttl = redis.call('PTTL', KEYS[1])
if current == ARGV[1] then
  -- Ours already: a retry of a request whose reply was lost, or a lock handed to us.
  -- A fresh fencing token is as good as the first (issued while we hold the lock).
  local fence = take_fence(KEYS[2], KEYS[3])
  if type(fence) == 'table' then
    return fence
  end
  -- The full lease from this request on (PEXPIRE GT never shortens): a lock handed to
  -- us near the end of its claim window is then still ours to use when the reply comes.
  if redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT') == 1 then
    pttl = tonumber(ARGV[2])
  end
  return {1, fence, pttl}
end
if ARGV[4] == '0' then
  return {0, pttl}
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local life = tonumber(ARGV[5])
redis.call('ZADD', KEYS[4], now + life, ARGV[3] .. ARGV[1])
redis.call('PEXPIRE', KEYS[4], life, 'GT')
if redis.call('PTTL', KEYS[4]) == -1 then
  redis.call('PEXPIRE', KEYS[4], life)
end
local foreign = 0
if pttl == -1 or string.byte(current, 33) ~= 64 then
  foreign = 1
end
if pttl < 0 or pttl > life / 2 then
  pttl = math.floor(life / 2)
end
return {0, pttl, fence_mark(KEYS[2], KEYS[3]) or false, foreign}
