-- election_campaign.lua: become the leader of an election that has none, or confirm
-- that we already are.
--
-- KEYS[1]  leader key    <prefix><name>: a hash {token, term, value, owner, since}
--                        whose PX TTL is the leader's lease
-- KEYS[2]  term key      {<leader key>}:term: a hash {term, token}, the highest term
--                        issued and the token it went to; outlives the lease by the
--                        retention period, so terms keep rising after a vacancy
-- KEYS[3]  history       {<leader key>}:history: a stream of the last 100 changes,
--                        each {kind, term, value, owner, since}; kind is elected,
--                        proclaimed, resigned or expired
-- ARGV[1]  token         this campaign's random token
-- ARGV[2]  value         the value the new leader publishes
-- ARGV[3]  owner         the candidate's owner label
-- ARGV[4]  ttl_ms        lease length
-- ARGV[5]  retention_ms  how long the term key and the history outlive the lease
-- ARGV[6]  publish       'PUBLISH' (standalone) or 'SPUBLISH' (cluster)
-- ARGV[7]  watch         the observers' channel, {<leader key>}:watch
--
-- Reply: term             (an integer) elected now, for the full ttl_ms
--        {1, term, pttl}  already ours: a retry after a lost reply, with what is left
--        {0, pttl}        another candidate leads; pttl is its remaining lease
--
-- The term comes from next_fence (fence.lua): strictly above every term issued before,
-- even after the term key expired. A leader whose lease ran out leaves no trace of
-- its going (no script runs when a key expires), so the election that follows records
-- it in the history first. Every key is read before anything is written, so a key of
-- the wrong type fails the call (WRONGTYPE) with nothing changed. Idempotent: a retry
-- finds its own token.
local held = redis.call('EXISTS', KEYS[1]) == 1
local leader = redis.call('HMGET', KEYS[1], 'token', 'term')
local prev = redis.call('HGET', KEYS[2], 'term')
local last = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)[1]
if held then
  local pttl = redis.call('PTTL', KEYS[1])
  if leader[1] == ARGV[1] then
    return {1, tonumber(leader[2]), pttl}
  end
  return {0, pttl}
end
local keep = tonumber(ARGV[4]) + tonumber(ARGV[5])
if last then
  local fields = {}
  for i = 1, #last[2], 2 do
    fields[last[2][i]] = last[2][i + 1]
  end
  if fields.kind == 'elected' or fields.kind == 'proclaimed' then
    redis.call('XADD', KEYS[3], 'MAXLEN', 100, '*', 'kind', 'expired', 'term', fields.term,
      'value', fields.value or '', 'owner', fields.owner or '', 'since', fields.since or '0')
  end
end
local term, now_ms = next_fence(tonumber(prev))
local t, since = string.format('%.0f', term), string.format('%.0f', now_ms)
redis.call('HSET', KEYS[1], 'token', ARGV[1], 'term', t, 'value', ARGV[2], 'owner', ARGV[3],
  'since', since)
redis.call('PEXPIRE', KEYS[1], ARGV[4])
redis.call('HSET', KEYS[2], 'term', t, 'token', ARGV[1])
redis.call('PEXPIRE', KEYS[2], keep)
redis.call('XADD', KEYS[3], 'MAXLEN', 100, '*', 'kind', 'elected', 'term', t, 'value', ARGV[2],
  'owner', ARGV[3], 'since', since)
redis.call('PEXPIRE', KEYS[3], keep)
redis.call(ARGV[6], ARGV[7], '*')
return term
