-- fair_release.lua: release the fair mutex and/or leave its queue; a lock freed with
-- live waiters queued goes straight to the first of them.
--
-- KEYS[1]  lock key
-- KEYS[2]  queue          {<lock key>}:queue
-- KEYS[3]  alive          {<lock key>}:alive
-- KEYS[4]  counter        the fencing counter of the lock's hash slot (see mark.lua)
-- KEYS[5]  floor          its floor
-- KEYS[6]  plain waiters  {<lock key>}:q, where plain-mutex waiters register
-- ARGV[1]  token          the acquisition's token
-- ARGV[2]  member         its queue entry, or '' when it never queued (a guard's release)
-- ARGV[3]  prefix         the fair channels' prefix {<lock key>}:wake:fair:
-- ARGV[4]  publish        'PUBLISH' or 'SPUBLISH'
-- ARGV[5]  plain channel  {<lock key>}:wake, where plain-mutex waiters listen
--
-- Reply: 1  released by this call
--        0  the token does not hold the lock (any queue entry of ours was removed)
--
-- When the lock is free afterwards, the first live waiter in the queue gets it (see
-- fair_queue.lua: a hand-over, not a wake-up); with nobody queued, registered
-- plain-mutex waiters are woken instead. Four calls when nobody waits; eight for a
-- hand-over. Idempotent: a retry finds nothing left to do and changes nothing.
local current = redis.call('GET', KEYS[1])
local released = 0
if current == ARGV[1] then
  released = 1
end
if ARGV[2] ~= '' then
  redis.call('ZREM', KEYS[2], ARGV[2])
  redis.call('ZREM', KEYS[3], ARGV[2])
end
if current and released == 0 then
  return 0
end
local head, deadline, ticket, now = next_live(KEYS[2], KEYS[3], nil)
if head then
  local failed = hand_over(KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], ARGV[3], ARGV[4],
    head, deadline, ticket, now)
  if failed then
    return failed
  end
  return released
end
if released == 1 then
  redis.call('UNLINK', KEYS[1])
  if redis.call('EXISTS', KEYS[6]) == 1 then
    redis.call(ARGV[4], ARGV[5], '1')
  end
end
return released
