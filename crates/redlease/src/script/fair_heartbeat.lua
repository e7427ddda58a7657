-- fair_heartbeat.lua: keep a waiting acquisition's place in the fair mutex's queue.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue          {<lock key>}:queue
-- KEYS[3]  alive          {<lock key>}:alive
-- ARGV[1]  member         "<id>:<label>": the waiter's queue entry
-- ARGV[2]  prefix         wake-up channel prefix
-- ARGV[3]  publish        'PUBLISH' or 'SPUBLISH'
-- ARGV[4]  waiter_ttl_ms  new deadline, from now (always the last argument)
--
-- Reply: 1  the entry is alive until now + waiter_ttl_ms
--        0  the entry is gone (it passed its deadline and was pruned, or was removed):
--           the waiter is told on its own channel, so it rejoins at once
--
-- Every live waiter's heartbeat prunes dead entries, and wakes the new head when a
-- dead one was blocking a free lock: a waiter that died mid-queue delays the next one
-- by at most its waiter TTL plus one heartbeat interval. Five calls.
local now = server_ms()
if prune(KEYS[2], KEYS[3], now) then
  wake_head(KEYS[1], KEYS[2], ARGV[2], ARGV[3])
end
if redis.call('ZADD', KEYS[3], 'XX', 'CH', now + tonumber(ARGV[4]), ARGV[1]) == 0
    and not redis.call('ZSCORE', KEYS[3], ARGV[1]) then
  redis.call(ARGV[3], ARGV[2] .. string.sub(ARGV[1], 1, 16), '1')
  return 0
end
expire_at_least(KEYS[2], ARGV[4])
expire_at_least(KEYS[3], ARGV[4])
return 1
