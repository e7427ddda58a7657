-- sem_release.lua: give back one acquisition's permits, handing the room made to
-- registered waiters; and, for a waiter that gives up, leave its registration.
--
-- KEYS[1]  permits   <prefix><name>
-- KEYS[2]  limit     {<key>}:limit
-- KEYS[3]  waiters   {<key>}:waiters
-- KEYS[4]  counter   the fencing counter of the key's hash slot (see mark.lua)
-- KEYS[5]  floor     its floor
-- ARGV[1]  token     the acquisition's token
-- ARGV[2]  count     how many permits it holds, or '0' when the caller does not know
--                    (a release by token): every permit of the token goes
-- ARGV[3]  limit     the caller's permit limit (the one in force while it holds)
-- ARGV[4]  prefix    the channels' prefix {<key>}:wake: (a client's is the prefix and
--                    its id)
-- ARGV[5]  publish   'PUBLISH' or 'SPUBLISH'
-- ARGV[6]  claim_ms  how long handed-out permits hold before their new holder extends
--                    them
-- ARGV[7]  registration  this acquisition's registration to leave, or '' (never
--                    registered)
--
-- Reply: 1  released by this call
--        0  not held: released before, or lapsed (lapsed permits are pruned first, so
--           an expired lease is never reported as released)
--
-- The permits freed (ours and lapsed ones) go to registered waiters that fit (see
-- sem_waiters.lua); the limit is forgotten with the last permit. Six calls while
-- other permits are held and nobody waits; twelve for a hand-over of one permit.
local now = server_ms()
local lapsed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local removed = 0
local count = tonumber(ARGV[2])
if count > 0 then
  local members = {}
  for i = 1, count do
    members[i] = ARGV[1] .. ':' .. i
  end
  removed = redis.call('ZREM', KEYS[1], unpack(members))
else
  -- An acquisition's permits are <token>:1 ..= <token>:n.
  while redis.call('ZREM', KEYS[1], ARGV[1] .. ':' .. (removed + 1)) == 1 do
    removed = removed + 1
  end
end
if ARGV[7] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[7])
end
if removed + lapsed > 0 then
  local used = redis.call('ZCARD', KEYS[1])
  local limit = tonumber(ARGV[3])
  -- Permits are handed out only under the limit in force: a caller of another limit
  -- (a waiter of an old one giving up, a release by token) frees room but hands
  -- nothing out — the waiters of the limit in force learn of it on their next attempt.
  if used > 0 and used < limit and redis.call('GET', KEYS[2]) ~= ARGV[3] then
    limit = used
  end
  if used < limit then
    local free = hand_out(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[3], ARGV[4], ARGV[5],
      ARGV[6], limit - used, now)
    if type(free) == 'table' then
      return free
    end
    used = limit - free
  end
  if used == 0 then
    redis.call('DEL', KEYS[2])
  end
end
if removed > 0 then
  return 1
end
return 0
