-- legacy_release.lua: DEL a legacy lock, only if its timestamp is still ours.
--
-- KEYS[1]  lock key
-- KEYS[2]  owner key
-- ARGV[1]  token         the holder's token
-- ARGV[2]  channel       wake-up channel of this lock (for redlease waiters)
-- ARGV[3]  publish       'PUBLISH' (standalone) or 'SPUBLISH' (cluster)
-- ARGV[4]  retention_ms  how long the record of this release is kept
--
-- Reply:  1  released by this call
--        -1  an earlier attempt of this release already released it (its reply was lost)
--         0  not ours (taken over, overwritten, deleted or expired); nothing was changed
if owned(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], '- ' .. ARGV[1], 'PX', ARGV[4])
  redis.call(ARGV[3], ARGV[2], '1')
  return 1
end
if redis.call('GET', KEYS[2]) == '- ' .. ARGV[1] then
  return -1
end
return 0
