-- election_renew.lua: renew or extend the lease of the leader of an election.
--
-- KEYS[1]  leader key
-- KEYS[2]  term key
-- KEYS[3]  history
-- ARGV[1]  token         the leader's token
-- ARGV[2]  retention_ms  how long the term key and the history outlive the lease
-- ARGV[3]  ttl_ms        the lease lasts at least this long from now (always the last
--                        argument)
--
-- Reply: 1  the token leads; its lease is now at least ttl_ms
--        0  the token does not lead (resigned, expired or taken over); nothing changed
--
-- Never shortens anything (PEXPIRE GT), so renewals and extends of one lease may run
-- in any order. Idempotent.
if redis.call('HGET', KEYS[1], 'token') ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[3], 'GT')
local keep = tonumber(ARGV[3]) + tonumber(ARGV[2])
redis.call('PEXPIRE', KEYS[2], keep, 'GT')
redis.call('PEXPIRE', KEYS[3], keep, 'GT')
return 1
