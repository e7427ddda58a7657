-- mutex_handoff.lua: pass the plain mutex from its holder straight to the next holder,
-- in one step: the lock never becomes free, so nobody can slip in between, and the
-- next holder gets a fresh token, lease and fencing token without a round trip of its
-- own. Used when the next waiter is a task of the same client.
--
-- KEYS[1]  lock key
-- KEYS[2]  meta key      "<fence> <since_ms> <token> <label>"
-- ARGV[1]  old token     the current holder's token
-- ARGV[2]  new token     the next holder's token
-- ARGV[3]  ttl_ms        the next holder's lease
-- ARGV[4]  tail          " <new token> <label>": the end of the metadata
-- ARGV[5]  meta_px       the metadata's TTL: ttl_ms plus how long it outlives the lease
--
-- Reply: fence            (an integer) handed over now, for the full ttl_ms
--        {1, fence, pttl}  already handed over: a retry after a lost reply
--        0                 the old token does not hold the lock; nothing was changed
local current = redis.call('GET', KEYS[1])
if current == ARGV[2] then
  -- Already handed over: a retry after a lost reply.
  local pttl = redis.call('PTTL', KEYS[1])
  local prev, _, meta_token = parse_meta(redis.call('GET', KEYS[2]))
  if meta_token == ARGV[2] then
    return {1, prev, pttl}
  end
  local fence, now_ms = next_fence(prev)
  redis.call('SET', KEYS[2], string.format('%.0f %.0f', fence, now_ms) .. ARGV[4], 'PX', ARGV[5])
  return {1, fence, pttl}
end
if current ~= ARGV[1] then
  return 0
end
-- The metadata first: a key of the wrong type fails the call with nothing written.
local fence = issue_fence(KEYS[2], ARGV[4], ARGV[5])
if type(fence) == 'table' then
  return fence
end
redis.call('SET', KEYS[1], ARGV[2], 'PX', ARGV[3])
return fence
