-- sem_acquire.lua: take `count` permits of a semaphore if that many are free; a waiter
-- that finds too few registers, so that a release can hand it the permits.
--
-- KEYS[1]  permits   <prefix><name>: sorted set "<token>:<i>" -> lease deadline (Redis
--                    ms), one member per permit held; the set's TTL covers its latest
--                    deadline
-- KEYS[2]  limit     {<key>}:limit: the permit limit, fixed while any permit is held
-- KEYS[3]  waiters   {<key>}:waiters: registrations (see sem_waiters.lua)
-- KEYS[4]  counter   the fencing counter of the key's hash slot (see mark.lua): its
-- KEYS[5]  floor     value is the mark a busy reply carries
-- ARGV[1]  registration  "<id><token><count>/<limit>": id 32 hex digits, token 32, then
--                    the number of permits wanted (1..limit) and the limit
-- ARGV[2]  limit     the caller's permit limit
-- ARGV[3]  ttl_ms    lease length
-- ARGV[4]  wait      '0': only try; '1': register when busy, and leave the registration
--                    when acquired
-- ARGV[5]  register_ms  how long a registration lives without a new attempt
-- ARGV[6]  prefix    the channels' prefix {<key>}:wake: (a client's is the prefix and
--                    its id)
-- ARGV[7]  publish   'PUBLISH' or 'SPUBLISH'
-- ARGV[8]  claim_ms  how long permits handed to a waiter hold before it extends them
--
-- Reply: 1                        acquired now, for the full ttl_ms
--        {1, remaining_ms}        already ours: a retry after a lost reply, or permits
--                                 handed to us — extended to at least ttl_ms
--        {0, remaining_ms, free, mark}
--                                 not enough free permits. remaining: until the earliest
--                                 held permit lapses unless renewed (-1: unknown), for a
--                                 registering waiter at most half its registration's
--                                 life; free: permits free right now (fewer than count);
--                                 mark: the slot's fencing mark (false when none): a
--                                 hand-over with a higher fence was made after this call
--        {-1, limit}              permits are held under another limit (the stored one);
--                                 nothing was changed
--
-- Permits whose deadline passed (their holder stopped renewing) are pruned first, so a
-- crashed holder's permits come back within their TTL (and what we do not take of them
-- goes to registered waiters, as a release would hand it out). When no permit is held,
-- the caller's limit becomes the limit. Seven calls when permits are free (eight for a
-- caller that would wait); eight for a waiter that registers.
local reg = ARGV[1]
local token = string.sub(reg, 33, 64)
local count = tonumber(string.match(reg, '^(%d+)/', 65))
local stored = redis.call('GET', KEYS[2])
local now = server_ms()
local lapsed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local used = redis.call('ZCARD', KEYS[1])
if stored and stored ~= ARGV[2] and used > 0 then
  return {-1, stored}
end
local limit = tonumber(ARGV[2])
-- Lapsed permits pruned here make room no release will announce: what we do not take
-- goes to registered waiters. Done before any permit of ours is written: a fencing
-- counter of another type fails the call with nothing taken (our registration left).
local function share_lapsed(taken)
  if lapsed > 0 and used + taken < limit then
    local free = hand_out(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[2], ARGV[6], ARGV[7],
      ARGV[8], limit - used - taken, now)
    if type(free) == 'table' then
      return free
    end
  end
  return nil
end
if used + count <= limit then
  if ARGV[4] ~= '0' then
    -- Leave the registration this acquisition made — an earlier attempt's, or this very
    -- request's when it is a retry whose first try registered and lost its reply —
    -- before sharing the lapsed room: handed a share, it would count our room twice
    -- and keep it from the waiters that fit. (Left behind, a later release would hand
    -- permits to it, and rewrite our permits' deadline to its short claim window.)
    redis.call('ZREM', KEYS[3], reg)
  end
  -- Permits of ours already held (handed to us by a release, or taken by this very
  -- request's first try whose reply was lost) are counted in `used`: they take no room
  -- beyond it.
  local taken = count
  if lapsed > 0 and redis.call('ZSCORE', KEYS[1], token .. ':1') then
    taken = 0
  end
  local failed = share_lapsed(taken)
  if failed then
    return failed
  end
  add_permits(KEYS[1], token, count, string.format('%d', now + tonumber(ARGV[3])))
  if used == 0 then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
  else
    expire_at_least(KEYS[1], ARGV[3])
  end
  if stored == ARGV[2] then
    expire_at_least(KEYS[2], ARGV[3])
  else
    redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
  end
  return 1
end
local mine = redis.call('ZSCORE', KEYS[1], token .. ':1')
if mine then
  -- Already ours: a retry after a lost reply, or permits handed to us (by a release, or
  -- by a task of our client) that we take up late. They last the full lease from now
  -- (never shorter: ZADD XX GT), so that the guard does not start out nearly lost.
  if ARGV[4] ~= '0' then
    redis.call('ZREM', KEYS[3], reg)
  end
  -- (Ours are among those held: the lapsed room goes to the waiters that fit in it, as
  -- above.)
  local failed = share_lapsed(0)
  if failed then
    return failed
  end
  local args = {}
  local deadline = string.format('%d', now + tonumber(ARGV[3]))
  for i = 1, count do
    args[2 * i - 1] = deadline
    args[2 * i] = token .. ':' .. i
  end
  redis.call('ZADD', KEYS[1], 'XX', 'GT', unpack(args))
  expire_at_least(KEYS[1], ARGV[3])
  expire_at_least(KEYS[2], ARGV[3])
  return {1, math.max(tonumber(mine) - now, tonumber(ARGV[3]))}
end
local first = redis.call('ZRANGE', KEYS[1], '0', '0', 'WITHSCORES')
local remaining = first[2] and (tonumber(first[2]) - now) or -1
local free = math.max(limit - used, 0)
if ARGV[4] == '0' then
  return {0, remaining, free, false}
end
-- (We do not fit in what is free: the lapsed room goes to waiters that do.)
local failed = share_lapsed(0)
if failed then
  return failed
end
local life = tonumber(ARGV[5])
redis.call('ZADD', KEYS[3], string.format('%d', now + life), reg)
-- (A registration is only a request to be handed permits: one that goes with the set
-- when a waiter with a shorter registration life set its TTL costs its waiter a grant,
-- not a permit — it looks again within half its life. So no PEXPIRE GT here.)
redis.call('PEXPIRE', KEYS[3], ARGV[5])
if remaining < 0 or remaining > life / 2 then
  remaining = math.floor(life / 2)
end
return {0, remaining, free, fence_mark(KEYS[4], KEYS[5]) or false}
