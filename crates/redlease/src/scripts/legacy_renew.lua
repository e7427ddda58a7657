-- legacy_renew.lua: push the timestamp of a legacy lock we hold further out.
--
-- KEYS[1]  lock key
-- KEYS[2]  owner key
-- ARGV[1]  token         the holder's token
-- ARGV[2]  unit          's' or 'ms'
-- ARGV[3]  timeout_ms    the new timeout, from now (always the last argument)
--
-- Reply: 1  still ours: the key now holds Redis time + timeout + 1
--        0  not ours any more (taken over, overwritten by an old client's GETSET,
--           deleted, or expired); nothing was changed
--
-- What an old client would do with GETSET on its own lock, done only after checking,
-- in the same step, that the timestamp is still the one this acquisition wrote.
-- Idempotent: a retry writes a fresh stamp again.
if not owned(ARGV[1]) then
  return 0
end
local now, now_ms = clock(ARGV[2])
write(ARGV[1], ARGV[2], tonumber(ARGV[3]), now, now_ms)
return 1
