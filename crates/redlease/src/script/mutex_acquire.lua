-- mutex_acquire.lua: take the plain mutex if it is free, or confirm we already hold it;
-- a waiter that finds it held registers, so that a release can hand it the lock.
--
-- KEYS[1]  lock key      <prefix><name>: the holder's token as a plain string with a PX
--                        TTL (the format of redis-py's Lock, node-redlock and redsync)
-- KEYS[2]  meta key      {<lock key>}:meta: "<fence> <since_ms> <token> <label>"
-- KEYS[3]  waiters       {<lock key>}:q: "<id> <token> <label>" -> registration deadline
--                        (Redis ms), the waiters a release may hand the lock to
-- ARGV[1]  token         this acquisition's random token
-- ARGV[2]  ttl_ms        lease length in milliseconds
-- ARGV[3]  tail          " <token> <label>": the end of the metadata (label: the
--                        owner's, such as host:pid) and of the registration
-- ARGV[4]  meta_px       the metadata's TTL: ttl_ms plus how long it outlives the lease
-- ARGV[5]  id            the waiter's public id (16 hex digits)
-- ARGV[6]  wait          '1': a waiter listening for a hand-over — register when busy,
--                        and leave the registration when acquired; '0': only try
-- ARGV[7]  register_ms   how long a registration lives without a new attempt
--
-- Reply: fence            (an integer) acquired now, for the full ttl_ms
--        {1, fence, pttl}  already ours: a retry after a lost reply, or a lock a release
--                          handed us, with its fence and what is left
--        {0, pttl}         held by someone else; pttl is its remaining TTL (-1: none),
--                          at most half the registration's life for a registered waiter
--                          (it must try again before the registration lapses)
--
-- Three calls when the lock is free (SET NX, TIME, and a SET that writes the metadata
-- and reads the previous fencing mark), three when it is held. Nothing is left
-- half-done: SET NX on a key of another type just fails (the GET that follows raises
-- WRONGTYPE before any write), and a metadata key of another type undoes the SET.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = issue_fence(KEYS[2], ARGV[3], ARGV[4])
  if type(fence) == 'table' then
    redis.call('DEL', KEYS[1])
    return fence
  end
  if ARGV[6] == '1' then
    redis.call('ZREM', KEYS[3], ARGV[5] .. ARGV[3])
  end
  return fence
end
local pttl = redis.call('PTTL', KEYS[1])
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  if ARGV[6] == '1' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local life = tonumber(ARGV[7])
    redis.call('ZADD', KEYS[3], now + life, ARGV[5] .. ARGV[3])
    redis.call('PEXPIRE', KEYS[3], life, 'GT')
    if redis.call('PTTL', KEYS[3]) == -1 then
      redis.call('PEXPIRE', KEYS[3], life)
    end
    if pttl < 0 or pttl > life / 2 then
      pttl = math.floor(life / 2)
    end
  end
  return {0, pttl}
end
-- Ours already: a retry of a request whose reply was lost, or a lock handed to us.
local meta = redis.call('GET', KEYS[2])
local prev, _, meta_token = parse_meta(meta)
if meta_token == ARGV[1] then
  return {1, prev, pttl}
end
-- Our lock, but its metadata was lost: issue a fresh fence.
local fence, now_ms = next_fence(prev)
redis.call('SET', KEYS[2], string.format('%.0f %.0f', fence, now_ms) .. ARGV[3], 'PX', ARGV[4])
return {1, fence, pttl}
