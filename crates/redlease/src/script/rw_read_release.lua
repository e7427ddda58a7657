-- rw_read_release.lua: give back one read share; the last reader out wakes a writer.
--
-- KEYS[1]  readers         {<lock key>}:readers
-- KEYS[2]  writers         {<lock key>}:writers
-- ARGV[1]  token           the reader's token
-- ARGV[2]  publish         'PUBLISH' or 'SPUBLISH'
-- ARGV[3]  writer channel  {<lock key>}:wake:write
--
-- Reply: 1  released by this call
--        0  the share was not held (released before, or lapsed: lapsed shares are
--           pruned first, so an expired lease is never reported as released)
--
-- Four calls while other readers remain.
local now = server_ms()
local lapsed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local removed = redis.call('ZREM', KEYS[1], ARGV[1])
if removed + lapsed > 0 and redis.call('EXISTS', KEYS[1]) == 0
    and redis.call('EXISTS', KEYS[2]) == 1 then
  redis.call(ARGV[2], ARGV[3], '1')
end
return removed
