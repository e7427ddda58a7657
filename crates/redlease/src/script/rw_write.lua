-- rw_write.lua: take the write lock if no writer holds it and no reader holds a share;
-- otherwise register as a waiting writer, which keeps new readers out.
--
-- KEYS[1]  lock key       <prefix><name>: the writer's token with a PX TTL
-- KEYS[2]  meta key       {<lock key>}:meta: "<fence> <since_ms> <token> <label>"
-- KEYS[3]  readers        {<lock key>}:readers: reader token -> lease deadline (Redis ms)
-- KEYS[4]  writers        {<lock key>}:writers: writer token -> registration deadline
-- KEYS[5]  counter        the fencing counter of the lock's hash slot (see mark.lua), so
-- KEYS[6]  floor          that the writer and a plain mutex of one name share the
--                         sequence of fencing tokens
-- ARGV[1]  token          this acquisition's random token
-- ARGV[2]  ttl_ms         lease length
-- ARGV[3]  label          owner label
-- ARGV[4]  retention_ms   how long the metadata outlives the lease
-- ARGV[5]  waiter_ttl_ms  how long a registration lives without a heartbeat
-- ARGV[6]  wait           '1': register when busy (and withdraw it on success);
--                         '0': only try
--
-- Reply: fence              acquired now, for the full ttl_ms
--        {1, fence, pttl}   already ours: a retry after a lost reply
--        {0, remaining_ms, registered}
--                           busy: a writer holds the lock (its lease) or readers hold
--                           shares (until the last of them lapses unless renewed);
--                           -1 when unknown. registered: 1 when this call created the
--                           registration (the writer must heartbeat it)
--
-- Six calls when free (seven when waiting was allowed). Idempotent: a retry finds its
-- token in the lock, or refreshes its registration.
local prev, _, meta_token = parse_meta(redis.call('GET', KEYS[2]))
local now = server_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
if redis.call('EXISTS', KEYS[3]) == 0 and redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = take_fence(KEYS[5], KEYS[6])
  if type(fence) == 'table' then
    redis.call('DEL', KEYS[1])
    return fence
  end
  if ARGV[6] == '1' then
    redis.call('ZREM', KEYS[4], ARGV[1])
  end
  redis.call('SET', KEYS[2],
    string.format('%.0f %.0f ', fence, now) .. ARGV[1] .. ' ' .. ARGV[3],
    'PX', tonumber(ARGV[2]) + tonumber(ARGV[4]))
  return fence
end
local pttl = redis.call('PTTL', KEYS[1])
if pttl ~= -2 and redis.call('GET', KEYS[1]) == ARGV[1] then
  if meta_token == ARGV[1] then
    return {1, prev, pttl}
  end
  local fence = take_fence(KEYS[5], KEYS[6])
  if type(fence) == 'table' then
    return fence
  end
  redis.call('SET', KEYS[2],
    string.format('%.0f %.0f ', fence, now) .. ARGV[1] .. ' ' .. ARGV[3],
    'PX', math.max(pttl, 1) + tonumber(ARGV[4]))
  return {1, fence, pttl}
end
local registered = 0
if ARGV[6] == '1' then
  registered = redis.call('ZADD', KEYS[4], now + tonumber(ARGV[5]), ARGV[1])
  expire_at_least(KEYS[4], ARGV[5])
end
if pttl >= 0 then
  return {0, pttl, registered}
end
local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
if last[2] then
  return {0, tonumber(last[2]) - now, registered}
end
return {0, -1, registered}
