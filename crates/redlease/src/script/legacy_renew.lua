-- legacy_renew.lua: push the timestamp of a legacy lock we hold further out.
--
-- KEYS[1]  lock key
-- KEYS[2]  owner key
-- ARGV[1]  token         the holder's token
-- ARGV[2]  unit          's' or 'ms'
-- ARGV[3]  timeout_ms    the new timeout, from now (always the last argument)
--
-- Reply: 1  still ours: the key now holds at least Redis time + timeout + 1
--        0  not ours any more (taken over, overwritten by an old client's GETSET,
--           deleted, or expired); nothing was changed
--
-- What an old client would do with GETSET on its own lock, done only after checking,
-- in the same step, that the timestamp is still the one this acquisition wrote.
-- Never moves the stamp back: renewals and extends in flight together leave the
-- latest stamp any of them asked for.
local stamp = owned(ARGV[1])
if not stamp then
  return 0
end
local now, now_ms = clock(ARGV[2])
if next_stamp(ARGV[2], tonumber(ARGV[3]), now) > stamp then
  write(ARGV[1], ARGV[2], tonumber(ARGV[3]), now, now_ms)
end
return 1
