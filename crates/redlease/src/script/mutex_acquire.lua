-- mutex_acquire.lua: take the plain mutex if it is free, or confirm we already hold it.
--
-- KEYS[1]  lock key      <prefix><name>: the holder's token as a plain string with a PX
--                        TTL (the format of redis-py's Lock, node-redlock and redsync)
-- KEYS[2]  meta key      {<lock key>}:meta: "<fence> <since_ms> <token> <label>"
-- ARGV[1]  token         this acquisition's random token
-- ARGV[2]  ttl_ms        lease length in milliseconds
-- ARGV[3]  tail          " <token> <label>": the end of the metadata (label: the
--                        owner's, such as host:pid)
-- ARGV[4]  meta_px       the metadata's TTL: ttl_ms plus how long it outlives the lease
--
-- Reply: fence            (an integer) acquired now, for the full ttl_ms
--        {1, fence, pttl}  already ours: a retry after a lost reply finds its own
--                          token and gets the fence it was given, and what is left
--        {0, pttl}         held by someone else; pttl is its remaining TTL (-1: none)
--
-- Three calls when the lock is free (SET NX, TIME, and a SET that writes the metadata
-- and reads the previous fencing mark), three when it is held. Nothing is left
-- half-done: SET NX on a key of another type just fails (the GET that follows raises
-- WRONGTYPE before any write), and a metadata key of another type undoes the SET.
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then
  local fence = issue_fence(KEYS[2], ARGV[3], ARGV[4])
  if type(fence) == 'table' then
    redis.call('DEL', KEYS[1])
  end
  return fence
end
local pttl = redis.call('PTTL', KEYS[1])
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0, pttl}
end
-- Ours already: a retry of a request whose reply was lost.
local meta = redis.call('GET', KEYS[2])
local prev, _, meta_token = parse_meta(meta)
if meta_token == ARGV[1] then
  return {1, prev, pttl}
end
-- Our lock, but its metadata was lost: issue a fresh fence.
local fence, now_ms = next_fence(prev)
redis.call('SET', KEYS[2], string.format('%.0f %.0f', fence, now_ms) .. ARGV[3], 'PX', ARGV[4])
return {1, fence, pttl}
