-- fair_heartbeat.lua: keep a waiting acquisition's place in the fair mutex's queue.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue          {<lock key>}:queue
-- KEYS[3]  alive          {<lock key>}:alive
-- ARGV[1]  member         "<id><token>": the waiter's queue entry
-- ARGV[2]  prefix         the fair channels' prefix {<lock key>}:wake:fair:
-- ARGV[3]  publish        'PUBLISH' or 'SPUBLISH'
-- ARGV[4]  waiter_ttl_ms  new deadline, from now (always the last argument)
--
-- Reply: 1  the entry is alive until now + waiter_ttl_ms
--        0  the entry is gone (it passed its deadline and was dropped, or was removed):
--           the waiter is told ("g <id> -"), so it rejoins at once
--
-- Every live waiter's heartbeat drops dead entries and, when it finds the lock free
-- with waiters queued (its holder's lease ran out, or a waiter handed the lock died
-- before taking it, or a client outside the queue released it), tells the first of them
-- to try again: a dead holder or waiter delays the queue by at most its lease or
-- waiter TTL plus one heartbeat interval. Seven calls when nothing is amiss.
local now = server_ms()
local dead = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now, 'LIMIT', 0, 256)
if #dead > 0 then
  redis.call('ZREM', KEYS[2], unpack(dead))
  redis.call('ZREM', KEYS[3], unpack(dead))
end
if redis.call('ZADD', KEYS[3], 'XX', 'CH', now + tonumber(ARGV[4]), ARGV[1]) == 0
    and not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  tell(ARGV[2], ARGV[3], ARGV[1], '-')
  return 0
end
expire_at_least(KEYS[2], ARGV[4])
expire_at_least(KEYS[3], ARGV[4])
if redis.call('EXISTS', KEYS[1]) == 0 then
  local head = redis.call('ZRANGE', KEYS[2], 0, 0)[1]
  if head then
    tell(ARGV[2], ARGV[3], head, '-')
  end
end
return 1
