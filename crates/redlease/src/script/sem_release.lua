-- sem_release.lua: give back one acquisition's permits and wake as many waiters.
--
-- KEYS[1]  permits   <prefix><name>
-- KEYS[2]  limit     {<key>}:limit
-- ARGV[1]  token     the acquisition's token
-- ARGV[2]  count     how many permits it holds, or '0' when the caller does not know
--                    (a release by token): every permit of the token goes
-- ARGV[3]  channel   wake-up channel {<key>}:wake
-- ARGV[4]  publish   'PUBLISH' or 'SPUBLISH'
--
-- Reply: 1  released by this call
--        0  not held: released before, or lapsed (lapsed permits are pruned first, so
--           an expired lease is never reported as released)
--
-- The message carries the number of permits freed (ours plus lapsed ones), and wakes
-- that many waiters in each listening process. The limit is forgotten with the last
-- permit. Five calls while other permits are held.
local now = server_ms()
local freed = redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
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
freed = freed + removed
if freed > 0 then
  if redis.call('EXISTS', KEYS[1]) == 0 then
    redis.call('DEL', KEYS[2])
  end
  redis.call(ARGV[4], ARGV[3], freed)
end
if removed > 0 then
  return 1
end
return 0
