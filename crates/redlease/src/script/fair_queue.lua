-- fair_queue.lua: shared prelude of the fair mutex scripts (after mark.lua and
-- expiry.lua).
--
-- The queue is two sorted sets with the same members, "<id><token>": id is the
-- waiter's public id (16 hex digits), token the token it will hold the lock with
-- ("<32 hex digits>@<owner label>", so status can show the label without a key of its
-- own).
--   {<lock key>}:queue  score = arrival ticket (1, 2, ...): the order of service
--   {<lock key>}:alive  score = the entry's deadline on Redis's clock (ms). A waiter
--                       heartbeats its entry every third of its waiter TTL; an entry
--                       past its deadline belongs to a waiter that died or hung.
--
-- The lock is never left free while a live waiter is queued: whoever frees it (a
-- release, a waiter leaving) or finds it free (an acquire) hands it to the first live
-- waiter — sets the lock to that waiter's token and tells it on the lock's fair channel,
-- "g <id> <fence>". The waiter holds the lock when it reads the message, without a
-- round trip of its own. Dead entries are dropped when they come to the head; the
-- lock handed to a waiter lasts until that waiter's own deadline, so one that died
-- after its last heartbeat holds the lock up no longer than its entry would have.
--
-- A message "g <id> -" hands over nothing: it tells waiter id to try again (its entry
-- vanished, or it is first in line behind a lock that was left free).

-- next_live(queue, alive, now) -> member, deadline, ticket, now: the first live waiter,
-- taken off both sets (dead ones before it are dropped), and the server time (read
-- here when `now` is nil and someone is queued); nil when no live waiter is queued
local function next_live(queue, alive, now)
  for _ = 1, 256 do
    local popped = redis.call('ZPOPMIN', queue)
    local member = popped[1]
    if not member then
      return nil, nil, nil, now
    end
    now = now or server_ms()
    local deadline = tonumber(redis.call('ZSCORE', alive, member))
    redis.call('ZREM', alive, member)
    if deadline and deadline > now then
      return member, deadline, popped[2], now
    end
  end
  return nil, nil, nil, now
end

-- hand_over(lock, queue, alive, counter, floor, channel, publish, member, deadline,
-- ticket, now): gives the lock to the waiter `member` (taken off the queue by
-- next_live) until its deadline, with a fresh fencing token, and tells it. Returns nil,
-- or the error reply of a fencing counter of another type (the waiter is put back).
local function hand_over(lock, queue, alive, counter, floor, channel, publish, member, deadline, ticket, now)
  local fence = take_fence(counter, floor)
  if type(fence) == 'table' then
    redis.call('ZADD', queue, ticket, member)
    redis.call('ZADD', alive, deadline, member)
    return fence
  end
  redis.call('SET', lock, string.sub(member, 17), 'PX', math.max(deadline - now, 1))
  redis.call(publish, channel, 'g ' .. string.sub(member, 1, 16) .. string.format(' %.0f', fence))
  return nil
end
