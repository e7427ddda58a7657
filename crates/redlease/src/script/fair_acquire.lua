-- fair_acquire.lua: take the fair mutex if it is free and no live waiter is ahead of
-- us; otherwise join the queue (or keep our place in it and refresh our deadline).
--
-- KEYS[1]  lock key       <prefix><name>: the holder's token with a PX TTL, exactly as
--                         the plain mutex (so plain clients are excluded too)
-- KEYS[2]  meta key       {<lock key>}:meta: "<fence> <since_ms> <token> <label>"
-- KEYS[3]  queue          {<lock key>}:queue: member -> arrival ticket
-- KEYS[4]  alive          {<lock key>}:alive: member -> deadline (Redis ms)
-- KEYS[5]  counter        the fencing counter of the lock's hash slot (see mark.lua), so
-- KEYS[6]  floor          that the fair and the plain mutex of one name share the
--                         sequence of fencing tokens
-- ARGV[1]  token          this acquisition's random token
-- ARGV[2]  member         "<id>:<label>": this acquisition's queue entry
-- ARGV[3]  ttl_ms         lease length
-- ARGV[4]  label          owner label, for the metadata
-- ARGV[5]  retention_ms   how long the metadata outlives the lease
-- ARGV[6]  waiter_ttl_ms  how long a queue entry lives without a heartbeat
-- ARGV[7]  wait           '1': join the queue when busy; '0': only try (nothing queued)
-- ARGV[8]  prefix         wake-up channel prefix; a waiter's channel is prefix .. id
-- ARGV[9]  publish        'PUBLISH' (standalone) or 'SPUBLISH' (cluster)
--
-- Reply: fence                acquired now, for the full ttl_ms (our entry, if any, left
--                             the queue in the same step)
--        {1, fence, pttl}     already ours: a retry after a lost reply
--        {0, pttl, position, joined}
--                             busy. position: our place in the queue (0: next), -1 when
--                             not queued (try). pttl: the holder's remaining lease when
--                             we are next or only trying (-1: none, -2: free but others
--                             are ahead); -1 otherwise. joined: 1 when this call created
--                             our entry (the waiter must heartbeat it)
--
-- Idempotent: a retried request finds its token in the lock, or its entry in the queue
-- (it keeps its ticket, hence its place). Seven calls when the lock is free and nobody
-- waits.
-- Every key is read before anything is written, so a key of the wrong type fails the
-- call (WRONGTYPE) with nothing changed.
local current = redis.call('GET', KEYS[1])
local prev, _, meta_token = parse_meta(redis.call('GET', KEYS[2]))
local head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
redis.call('ZSCORE', KEYS[4], ARGV[2])
if current == ARGV[1] then
  -- Ours already: a retry of a request whose reply was lost.
  local pttl = redis.call('PTTL', KEYS[1])
  if meta_token == ARGV[1] then
    return {1, prev, pttl}
  end
  -- Our lock, but its metadata was lost: issue a fresh fence.
  local fence = take_fence(KEYS[5], KEYS[6])
  if type(fence) == 'table' then
    return fence
  end
  redis.call('SET', KEYS[2],
    string.format('%.0f %.0f ', fence, server_ms()) .. ARGV[1] .. ' ' .. ARGV[4],
    'PX', math.max(pttl, 1) + tonumber(ARGV[5]))
  return {1, fence, pttl}
end
local now = nil
local head_changed = false
if head and head ~= ARGV[2] then
  now = server_ms()
  if prune(KEYS[3], KEYS[4], now) then
    head_changed = true
    head = redis.call('ZRANGE', KEYS[3], 0, 0)[1]
  end
end
if not current and (not head or head == ARGV[2]) then
  -- The fencing token first: a counter key of another type fails the call with
  -- nothing written.
  local fence = take_fence(KEYS[5], KEYS[6])
  if type(fence) == 'table' then
    return fence
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[3])
  if head then
    redis.call('ZREM', KEYS[3], ARGV[2])
    redis.call('ZREM', KEYS[4], ARGV[2])
  end
  redis.call('SET', KEYS[2],
    string.format('%.0f %.0f ', fence, now or server_ms()) .. ARGV[1] .. ' ' .. ARGV[4],
    'PX', tonumber(ARGV[3]) + tonumber(ARGV[5]))
  return fence
end
local pttl = -2
if current then
  pttl = redis.call('PTTL', KEYS[1])
end
if head_changed then
  -- A dead head was pruned while the lock is free: its successor must hear of it.
  wake_head(KEYS[1], KEYS[3], ARGV[8], ARGV[9])
end
if ARGV[7] ~= '1' then
  return {0, pttl, -1, 0}
end
now = now or server_ms()
local deadline = now + tonumber(ARGV[6])
local joined = 0
if redis.call('ZADD', KEYS[4], 'XX', 'CH', deadline, ARGV[2]) == 0 then
  if not redis.call('ZSCORE', KEYS[3], ARGV[2]) then
    local last = redis.call('ZRANGE', KEYS[3], -1, -1, 'WITHSCORES')
    redis.call('ZADD', KEYS[3], (tonumber(last[2]) or 0) + 1, ARGV[2])
    joined = 1
  end
  redis.call('ZADD', KEYS[4], deadline, ARGV[2])
end
expire_at_least(KEYS[3], ARGV[6])
expire_at_least(KEYS[4], ARGV[6])
local position = redis.call('ZRANK', KEYS[3], ARGV[2])
if position ~= 0 then
  pttl = -1
end
return {0, pttl, position, joined}
