-- sem_handoff.lua: move one acquisition's permits from their holder straight to the
-- next holder, in one step: the permits are never free, so nobody can slip in between,
-- and the next holder gets them under its own token with a fresh lease of its own
-- length, without a round trip of its own. Used when the next holder is a task of the
-- same client that waits for as many permits under the same limit (the limit in force
-- while the old holder's permits are held).
--
-- KEYS[1]  permits   <prefix><name>
-- KEYS[2]  limit     {<key>}:limit
-- ARGV[1]  old token   the holder's token
-- ARGV[2]  new token   the next holder's token
-- ARGV[3]  count       how many permits the holder holds (and the next one wants)
-- ARGV[4]  ttl_ms      the next holder's lease
--
-- Reply: 1                  handed over now, for the full ttl_ms
--        {1, remaining_ms}  already handed over: a retry after a lost reply
--        0                  the old token holds no permit (released, or lapsed); nothing
--                           was changed
--
-- The old token's permits are gone afterwards: a release or a renewal with it finds
-- nothing. Six calls.
local now = server_ms()
local handed = redis.call('ZSCORE', KEYS[1], ARGV[2] .. ':1')
if handed and tonumber(handed) > now then
  return {1, tonumber(handed) - now}
end
local held = redis.call('ZSCORE', KEYS[1], ARGV[1] .. ':1')
if not held or tonumber(held) <= now then
  return 0
end
local count = tonumber(ARGV[3])
local members = {}
for i = 1, count do
  members[i] = ARGV[1] .. ':' .. i
end
redis.call('ZREM', KEYS[1], unpack(members))
add_permits(KEYS[1], ARGV[2], count, string.format('%d', now + tonumber(ARGV[4])))
expire_at_least(KEYS[1], ARGV[4])
expire_at_least(KEYS[2], ARGV[4])
return 1
