-- mutex_acquire.lua: take the plain mutex if it is free, or confirm we already hold it.
--
-- KEYS[1]  lock key      <prefix><name>: the holder's token as a plain string with a PX
--                        TTL (the format of redis-py's Lock, node-redlock and redsync)
-- KEYS[2]  meta key      {<lock key>}:meta: "<fence> <since_ms> <token> <label>"
-- ARGV[1]  token         this acquisition's random token
-- ARGV[2]  ttl_ms        lease length in milliseconds
-- ARGV[3]  label         human label of the owner, such as host:pid
-- ARGV[4]  retention_ms  how long the metadata outlives the lease
--
-- Reply: fence            (an integer) acquired now, for the full ttl_ms
--        {1, fence, pttl}  already ours: a retry after a lost reply finds its own
--                          token and gets the fence it was given, and what is left
--        {0, pttl}         held by someone else; pttl is its remaining TTL (-1: none)
--
-- Four calls when the lock is free. The metadata is read first, so a WRONGTYPE error
-- aborts before anything is written.
local prev, _, meta_token = parse_meta(redis.call('GET', KEYS[2]))
local pttl = nil
if not redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  pttl = redis.call('PTTL', KEYS[1])
  if redis.call('GET', KEYS[1]) ~= ARGV[1] then
    return {0, pttl}
  end
  if meta_token == ARGV[1] then
    return {1, prev, pttl}
  end
  -- Our lock, but its metadata was lost: issue a fresh fence below.
end
local fence, now_ms = next_fence(prev)
redis.call('SET', KEYS[2],
  string.format('%.0f %.0f ', fence, now_ms) .. ARGV[1] .. ' ' .. ARGV[3],
  'PX', math.max(pttl or tonumber(ARGV[2]), 1) + tonumber(ARGV[4]))
if pttl then
  return {1, fence, pttl}
end
return fence
