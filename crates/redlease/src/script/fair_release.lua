-- fair_release.lua: release the fair mutex and/or leave its queue, and wake only the
-- next live waiter.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue          {<lock key>}:queue
-- KEYS[3]  alive          {<lock key>}:alive
-- ARGV[1]  token          the acquisition's token
-- ARGV[2]  member         its queue entry, or '' when it never queued (a guard's release)
-- ARGV[3]  prefix         wake-up channel prefix
-- ARGV[4]  publish        'PUBLISH' or 'SPUBLISH'
-- ARGV[5]  plain channel  {<lock key>}:wake, where plain-mutex waiters listen
--
-- Reply: 1  released by this call
--        0  the token does not hold the lock (any queue entry of ours was removed)
--
-- When the lock is free afterwards, the head of the queue is woken on its own channel;
-- with nobody queued, plain-mutex waiters are woken instead. Four calls when nobody
-- waits. Idempotent: a retry finds nothing left to do and changes nothing.
local released = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  released = 1
end
local left = 0
if ARGV[2] ~= '' then
  left = redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
end
if released == 0 and (left == 0 or redis.call('EXISTS', KEYS[1]) == 1) then
  return 0
end
local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
if head and prune(KEYS[2], KEYS[3], server_ms()) then
  head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
end
if head then
  redis.call(ARGV[4], ARGV[3] .. string.sub(head, 1, 16), '1')
elseif released == 1 then
  redis.call(ARGV[4], ARGV[5], '1')
end
return released
