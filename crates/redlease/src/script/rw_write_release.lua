-- rw_write_release.lua: release the write lock and/or withdraw a waiting writer's
-- registration, and wake whoever may proceed.
--
-- KEYS[1]  lock key
-- KEYS[2]  writers         {<lock key>}:writers
-- ARGV[1]  token           the writer's token
-- ARGV[2]  withdraw        '1': also remove this token's registration (a cancelled or
--                          failed acquire); '0': a holder's release
-- ARGV[3]  publish         'PUBLISH' or 'SPUBLISH'
-- ARGV[4]  reader channel  {<lock key>}:wake:read
-- ARGV[5]  writer channel  {<lock key>}:wake:write
--
-- Reply: 1  released by this call
--        0  the token does not hold the lock (a registration, if any, was withdrawn)
--
-- Writer-preferring hand-over: another registered writer is woken first (one per
-- process); only when none waits are all readers woken. Four calls when nobody waits.
local released = 0
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  released = 1
end
local withdrew = 0
if ARGV[2] == '1' then
  withdrew = redis.call('ZREM', KEYS[2], ARGV[1])
end
if released == 0 and (withdrew == 0 or redis.call('EXISTS', KEYS[1]) == 1) then
  return 0
end
local waiting = redis.call('EXISTS', KEYS[2]) == 1
if waiting then
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', server_ms())
  waiting = redis.call('EXISTS', KEYS[2]) == 1
end
if not waiting then
  redis.call(ARGV[3], ARGV[4], '*')
elseif released == 1 then
  redis.call(ARGV[3], ARGV[5], '1')
end
return released
