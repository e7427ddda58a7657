-- mutex_extend.lua: renew or extend the lease of the holder of a plain mutex (or of a
-- Redlock on one of its masters).
--
-- KEYS[1]  lock key
-- ARGV[1]  token         the holder's token
-- ARGV[2]  ttl_ms        the lease lasts at least this long from now (always the last
--                        argument)
--
-- Reply: 1  the token holds the lock; its TTL is now at least ttl_ms
--        0  the token does not hold the lock (released, expired or taken over);
--           nothing was changed
--
-- Never shortens the lease (PEXPIRE GT): renewals and extends of one lease may be in
-- flight together and run in any order, and the lease is then the longest any of them
-- asked for — never less than what the holder was told. Idempotent: a retry of the
-- same request changes nothing more.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2], 'GT')
return 1
