-- election_resign.lua: the leader steps down; waiting candidates and observers are told.
--
-- KEYS[1]  leader key
-- KEYS[2]  term key
-- KEYS[3]  history
-- ARGV[1]  token         the leader's token
-- ARGV[2]  retention_ms  how long the history outlives the change
-- ARGV[3]  publish       'PUBLISH' or 'SPUBLISH'
-- ARGV[4]  wake          the candidates' channel, {<leader key>}:wake
-- ARGV[5]  watch         the observers' channel, {<leader key>}:watch
--
-- Reply:  1  resigned by this call
--        -1  nobody leads and this token was the last leader: an earlier attempt of
--            this call resigned (its reply was lost), or the lease ran out
--         0  the token does not lead: another does, or nobody after another; nothing
--            was changed
--
-- One message on the candidates' channel wakes one candidate per waiting process;
-- the first to try leads next. Idempotent: a retry finds nothing left to do.
local leader = redis.call('HMGET', KEYS[1], 'token', 'term', 'value', 'owner', 'since')
redis.call('XLEN', KEYS[3])
if leader[1] == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('XADD', KEYS[3], 'MAXLEN', 100, '*', 'kind', 'resigned', 'term', leader[2],
    'value', leader[3] or '', 'owner', leader[4] or '', 'since', leader[5] or '0')
  expire_at_least(KEYS[3], ARGV[2])
  redis.call(ARGV[3], ARGV[4], '1')
  redis.call(ARGV[3], ARGV[5], '*')
  return 1
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
if redis.call('HGET', KEYS[2], 'token') == ARGV[1] then
  return -1
end
return 0
