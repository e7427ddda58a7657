-- sem_extend.lua: renew or extend the lease of one acquisition's permits.
--
-- KEYS[1]  permits   <prefix><name>
-- KEYS[2]  limit     {<key>}:limit
-- ARGV[1]  token     the acquisition's token
-- ARGV[2]  count     how many permits it holds
-- ARGV[3]  channel   wake-up channel {<key>}:wake
-- ARGV[4]  publish   'PUBLISH' or 'SPUBLISH'
-- ARGV[5]  ttl_ms    the permits last at least this long from now (always the last
--                    argument)
--
-- Reply: 1  the permits are held until at least now + ttl_ms
--        0  they are gone: released, or lapsed and pruned (possibly given to someone
--           else). Nothing of ours changed.
--
-- Lapsed permits of other holders are pruned and announced, so waiters learn of a
-- crashed holder from any live holder's renewal. Never shortens the lease (ZADD GT):
-- renewals and extends in flight together leave the longest deadline any of them
-- asked for. Six calls.
local now = server_ms()
local lapsed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
if lapsed > 0 then
  redis.call(ARGV[4], ARGV[3], lapsed)
end
if not redis.call('ZSCORE', KEYS[1], ARGV[1] .. ':1') then
  return 0
end
local deadline = now + tonumber(ARGV[5])
local args = {}
for i = 1, tonumber(ARGV[2]) do
  args[2 * i - 1] = deadline
  args[2 * i] = ARGV[1] .. ':' .. i
end
redis.call('ZADD', KEYS[1], 'XX', 'GT', unpack(args))
expire_at_least(KEYS[1], ARGV[5])
expire_at_least(KEYS[2], ARGV[5])
return 1
