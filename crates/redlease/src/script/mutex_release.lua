-- mutex_release.lua: compare-and-delete the plain mutex — or hand it straight to the
-- next registered waiter — and, for a waiter that gives up, leave the registration.
--
-- KEYS[1]  lock key
-- KEYS[2]  meta key      "<fence> <since_ms> <token> <label>"
-- KEYS[3]  waiters       {<lock key>}:q: "<id> <token> <label>" -> registration deadline
-- ARGV[1]  token         the holder's token
-- ARGV[2]  channel       wake-up channel of this lock
-- ARGV[3]  publish       'PUBLISH' (standalone) or 'SPUBLISH' (cluster)
-- ARGV[4]  claim_ms      how long a handed lock holds before its new holder extends it
-- ARGV[5]  meta_px       the metadata's TTL for the new holder
-- ARGV[6]  registration  this acquisition's own registration, "<id> <token> <label>", to
--                        leave (a waiter that gives up); '' for a holder's release
--
-- Reply:  1  released (or handed over) by this call
--        -1  the lock is free and this token was its last holder: an earlier attempt
--            of this release succeeded (its reply was lost), or the lease expired
--         0  the token does not hold the lock: it is held by another token, or free
--            after another holder; nothing was changed (but the registration left)
--
-- A hand-over: the first live registered waiter (earliest deadline: the longest
-- waiting) gets the lock with its own token for claim_ms, a fresh fencing token in the
-- metadata, and a message "g <id> <fence>" on the channel — the waiter holds the lock
-- when it reads it, one hop after this release instead of a wake-up and an acquire.
-- Dead registrations (past their deadline) are pruned first. Without a registered
-- waiter the lock is deleted and a wake-up published, for waiters that do not register
-- (a Redlock's, a waiter under a replica policy). Four calls then.
local current = redis.call('GET', KEYS[1])
if current == ARGV[1] then
  local head = redis.call('ZRANGE', KEYS[3], 0, 0, 'WITHSCORES')
  if head[1] then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    if tonumber(head[2]) <= now then
      redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', now)
      head = redis.call('ZRANGE', KEYS[3], 0, 0)
    end
    local waiter = head[1]
    if waiter then
      redis.call('ZREM', KEYS[3], waiter)
      local tail = string.sub(waiter, 17)
      local space = string.find(tail, ' ', 2, true)
      local token = string.sub(tail, 2, (space or 0) - 1)
      local fence = issue_fence(KEYS[2], tail, ARGV[5])
      if type(fence) == 'table' then
        return fence
      end
      redis.call('SET', KEYS[1], token, 'PX', ARGV[4])
      redis.call(ARGV[3], ARGV[2], 'g ' .. string.sub(waiter, 1, 16) .. ' ' .. fence)
      return 1
    end
  end
  redis.call('UNLINK', KEYS[1])
  redis.call(ARGV[3], ARGV[2], '1')
  return 1
end
if ARGV[6] ~= '' then
  redis.call('ZREM', KEYS[3], ARGV[6])
end
if current then
  return 0
end
-- The metadata is "<fence> <since_ms> <token> <label>".
local meta = redis.call('GET', KEYS[2])
if meta and string.find(meta, ' ' .. ARGV[1] .. ' ', 1, true) then
  return -1
end
return 0
