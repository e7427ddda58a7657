-- rw_read_extend.lua: renew or extend one reader's lease.
--
-- KEYS[1]  readers    {<lock key>}:readers
-- ARGV[1]  token      the reader's token
-- ARGV[2]  ttl_ms     new remaining lease, from now (always the last argument)
--
-- Reply: 1  the share is held until now + ttl_ms
--        0  the share is gone: released, or its deadline passed (then it is removed:
--           a writer may already have been let in). Nothing else changed.
--
-- Idempotent: a retry sets the same deadline again. Four calls.
local now = server_ms()
local deadline = redis.call('ZSCORE', KEYS[1], ARGV[1])
if not deadline then
  return 0
end
if tonumber(deadline) <= now then
  redis.call('ZREM', KEYS[1], ARGV[1])
  return 0
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), ARGV[1])
expire_at_least(KEYS[1], ARGV[2])
return 1
