-- fair_acquire.lua: take the fair mutex if it is free and no live waiter is ahead of
-- us; otherwise join the queue (or keep our place in it and refresh our deadline).
--
-- KEYS[1]  lock key       <prefix><name>: the holder's token with a PX TTL, exactly as
--                         the plain mutex (so plain clients are excluded too)
-- KEYS[2]  queue          {<lock key>}:queue: member -> arrival ticket
-- KEYS[3]  alive          {<lock key>}:alive: member -> deadline (Redis ms)
-- KEYS[4]  counter        the fencing counter of the lock's hash slot (see mark.lua), so
-- KEYS[5]  floor          that the fair and the plain mutex of one name share the
--                         sequence of fencing tokens
-- ARGV[1]  member         "<id><token>": this acquisition's queue entry; the token is
--                         what follows the 32 hex digits of the id
-- ARGV[2]  ttl_ms         lease length
-- ARGV[3]  waiter_ttl_ms  how long a queue entry lives without a heartbeat
-- ARGV[4]  wait           '1': join the queue when busy; '0': only try (nothing queued)
-- ARGV[5]  prefix         the fair channels' prefix {<lock key>}:wake:fair: (a client's
--                         is the prefix and its id)
-- ARGV[6]  publish        'PUBLISH' (standalone) or 'SPUBLISH' (cluster)
--
-- Reply: fence                acquired now, for the full ttl_ms (our entry, if any, left
--                             the queue in the same step)
--        {1, fence, pttl}     already ours — a retry after a lost reply, or a lock handed
--                             to us — with a fresh fencing token, its TTL extended to at
--                             least ttl_ms, and what is left
--        {0, pttl, position, joined, mark, foreign}
--                             busy. position: our place in the queue (0: next), -1 when
--                             not queued (try). pttl: the holder's remaining lease when
--                             we are next or only trying (-1: none), -1 otherwise.
--                             joined: 1 when this call created our entry (the waiter
--                             must heartbeat it). mark: the slot's fencing mark (a
--                             decimal string, false when none): a hand-over with a
--                             higher fence was made after this call. foreign: 1 when
--                             we are next and the holder is not a redlease client (its
--                             release announces nothing: the waiter polls)
--
-- A free lock with live waiters queued goes to the first of them (see fair_queue.lua),
-- and we queue behind. Idempotent: a retried request finds its token in the lock, or
-- its entry in the queue (it keeps its ticket, hence its place). Four calls when the
-- lock is free and nobody waits; nine for a waiter that joins behind another. The lock
-- key is read first, so one of another type fails the call (WRONGTYPE) with nothing
-- changed.
local member = ARGV[1]
local token = string.sub(member, 33)
local current = redis.call('GET', KEYS[1])
if current == token then
  -- Ours already: a retry of a request whose reply was lost, or a lock handed to us.
  -- A fresh fencing token is as good as the first (issued while we hold the lock).
  local fence = take_fence(KEYS[4], KEYS[5])
  if type(fence) == 'table' then
    return fence
  end
  -- The full lease from this request on (PEXPIRE GT never shortens): a lock handed to
  -- us near the end of its claim window is then still ours to use when the reply comes.
  redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
  return {1, fence, redis.call('PTTL', KEYS[1])}
end
local now = nil
if not current then
  local head, deadline, ticket
  head, deadline, ticket, now = next_live(KEYS[2], KEYS[3], nil)
  if not head or head == member then
    -- Nobody live is ahead of us. The fencing token first: a counter key of another
    -- type fails the call with nothing written (our entry, if taken off, goes back).
    local fence = take_fence(KEYS[4], KEYS[5])
    if type(fence) == 'table' then
      if head then
        redis.call('ZADD', KEYS[2], ticket, head)
        redis.call('ZADD', KEYS[3], deadline, head)
        expire_at_least(KEYS[2], deadline - now)
        expire_at_least(KEYS[3], deadline - now)
      end
      return fence
    end
    redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
    return fence
  end
  local failed = hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[5], ARGV[6],
    head, deadline, ticket, now)
  if failed then
    return failed
  end
  current = string.sub(head, 33)
end
if ARGV[4] ~= '1' then
  return {0, redis.call('PTTL', KEYS[1]), -1, 0, false, 0}
end
now = now or server_ms()
local joined = 0
-- (Numbers are passed to Redis as strings printed with '%d': a Lua number argument is
-- printed with '%.17g', which costs more.)
if redis.call('ZADD', KEYS[3], string.format('%d', now + tonumber(ARGV[3])), member) == 1
    or not redis.call('ZSCORE', KEYS[2], member) then
  local last = redis.call('ZRANGE', KEYS[2], '-1', '-1', 'WITHSCORES')
  joined = redis.call('ZADD', KEYS[2], 'NX', (tonumber(last[2]) or 0) + 1, member)
end
local position
if joined == 1 then
  position = redis.call('ZCARD', KEYS[2]) - 1
else
  position = redis.call('ZRANK', KEYS[2], member)
end
-- Both sets live at least as long as our entry. With a waiter ahead of us they existed
-- before this call, so they have a TTL (every write gives them one), which PEXPIRE GT
-- only ever lengthens; a set we may just have created gets its first TTL.
if position == 0 then
  expire_at_least(KEYS[2], ARGV[3])
  expire_at_least(KEYS[3], ARGV[3])
else
  redis.call('PEXPIRE', KEYS[2], ARGV[3], 'GT')
  redis.call('PEXPIRE', KEYS[3], ARGV[3], 'GT')
end
local pttl, foreign = -1, 0
if position == 0 then
  pttl = redis.call('PTTL', KEYS[1])
  if pttl == -1 or string.byte(current, 33) ~= 64 then
    foreign = 1
  end
end
return {0, pttl, position, joined, fence_mark(KEYS[4], KEYS[5]) or false, foreign}
