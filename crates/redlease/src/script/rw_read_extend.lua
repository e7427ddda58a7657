-- rw_read_extend.lua: renew or extend one reader's lease.
--
-- KEYS[1]  readers    {<lock key>}:readers
-- ARGV[1]  token      the reader's token
-- ARGV[2]  ttl_ms     the share lasts at least this long from now (always the last
--                      argument)
--
-- Reply: 1  the share is held until at least now + ttl_ms
--        0  the share is gone: released, or its deadline passed (then it is removed:
--           a writer may already have been let in). Nothing else changed.
--
-- Never shortens the share (ZADD GT): renewals and extends in flight together leave
-- the longest deadline any of them asked for. Four calls.
local now = server_ms()
local deadline = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not deadline then
  return 0
end
if tonumber(deadline) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], 'GT', now + tonumber(ARGV[2]), ARGV[1])
expire_at_least(KEYS[1], ARGV[2])
return 1
