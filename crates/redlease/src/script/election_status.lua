-- election_status.lua: who leads an election, and what changed since a point in its
-- history; never reveals a token.
--
-- KEYS[1]  leader key
-- KEYS[2]  term key
-- KEYS[3]  history
-- ARGV[1]  after   a history entry id: return the entries after it (at most 100);
--                  '': return only the last entry
--
-- Reply: {leads, pttl, term, value, owner, since_ms, last_term, entries}
--   leads      1 when someone leads, else 0
--   pttl       the leader's remaining lease in ms (-2: nobody leads)
--   term..since_ms  the leader's, or false
--   last_term  the highest term issued within the retention period, or false
--   entries    history entries as XRANGE returns them: {id, {field, value, ...}}
--
-- Read-only.
local leader = redis.call('HMGET', KEYS[1], 'token', 'term', 'value', 'owner', 'since')
local pttl = redis.call('PTTL', KEYS[1])
local last_term = redis.call('HGET', KEYS[2], 'term')
local entries
if ARGV[1] == '' then
  entries = redis.call('XREVRANGE', KEYS[3], '+', '-', 'COUNT', 1)
else
  entries = redis.call('XRANGE', KEYS[3], '(' .. ARGV[1], '+', 'COUNT', 100)
end
if not leader[1] then
  return {0, -2, false, false, false, false, last_term, entries}
end
return {1, pttl, leader[2], leader[3], leader[4], leader[5], last_term, entries}
