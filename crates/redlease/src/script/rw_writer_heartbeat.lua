-- rw_writer_heartbeat.lua: keep a waiting writer's registration alive.
--
-- KEYS[1]  writers        {<lock key>}:writers
-- ARGV[1]  token          the waiting writer's token
-- ARGV[2]  waiter_ttl_ms  new deadline, from now (always the last argument)
--
-- Reply: 1  registered until now + waiter_ttl_ms
--        0  the registration is gone (it lapsed and was pruned): the writer registers
--           again on its next attempt
--
-- Prunes lapsed registrations of writers that died. Four calls.
local now = server_ms()
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if redis.call('ZADD', KEYS[1], 'XX', 'CH', now + tonumber(ARGV[2]), ARGV[1]) == 0
    and not redis.call('ZSCORE', KEYS[1], ARGV[1]) then
  return 0
end
expire_at_least(KEYS[1], ARGV[2])
return 1
