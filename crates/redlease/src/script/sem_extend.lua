-- sem_extend.lua: renew or extend the lease of one acquisition's permits.
--
-- KEYS[1]  permits   <prefix><name>
-- KEYS[2]  limit     {<key>}:limit
-- ARGV[1]  token     the acquisition's token
-- ARGV[2]  count     how many permits it holds
-- ARGV[3]  ttl_ms    the permits last at least this long from now (always the last
--                    argument)
--
-- Reply: 1  the permits are held until at least now + ttl_ms
--        0  they are gone: released, or lapsed and pruned (possibly given to someone
--           else). Nothing of ours changed.
--
-- Never shortens the lease (ZADD GT): renewals and extends in flight together leave the
-- longest deadline any of them asked for. Names only the keys that exist while permits
-- are held (a Redis Cluster refuses a script naming a missing key while the slot
-- migrates). Five calls.
local now = server_ms()
local mine = redis.call('ZSCORE', KEYS[1], ARGV[1] .. ':1')
if not mine or tonumber(mine) <= now then
  return 0
end
local deadline = string.format('%d', now + tonumber(ARGV[3]))
local args = {}
for i = 1, tonumber(ARGV[2]) do
  args[2 * i - 1] = deadline
  args[2 * i] = ARGV[1] .. ':' .. i
end
redis.call('ZADD', KEYS[1], 'XX', 'GT', unpack(args))
expire_at_least(KEYS[1], ARGV[3])
expire_at_least(KEYS[2], ARGV[3])
return 1
