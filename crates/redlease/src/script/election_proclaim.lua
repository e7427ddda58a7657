-- election_proclaim.lua: the leader publishes a new value.
--
-- KEYS[1]  leader key
-- KEYS[2]  history
-- ARGV[1]  token         the leader's token
-- ARGV[2]  value         the new value
-- ARGV[3]  retention_ms  how long the history outlives the lease
-- ARGV[4]  publish       'PUBLISH' or 'SPUBLISH'
-- ARGV[5]  watch         the observers' channel, {<leader key>}:watch
--
-- Reply: 1  the token leads and its value is now ARGV[2]
--        0  the token does not lead; nothing was changed
--
-- A value equal to the current one changes nothing and tells nobody, so a retry after
-- a lost reply is harmless.
local leader = redis.call('HMGET', KEYS[1], 'token', 'term', 'value', 'owner', 'since')
redis.call('XLEN', KEYS[2])
if leader[1] ~= ARGV[1] then
  return 0
end
if leader[3] == ARGV[2] then
  return 1
end
redis.call('HSET', KEYS[1], 'value', ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', 100, '*', 'kind', 'proclaimed', 'term', leader[2],
  'value', ARGV[2], 'owner', leader[4] or '', 'since', leader[5] or '0')
expire_at_least(KEYS[2], math.max(redis.call('PTTL', KEYS[1]), 0) + tonumber(ARGV[3]))
redis.call(ARGV[4], ARGV[5], '*')
return 1
