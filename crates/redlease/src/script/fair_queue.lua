-- fair_queue.lua: shared prelude of the fair mutex scripts (after mark.lua and
-- expiry.lua).
--
-- The queue is two sorted sets with the same members, "<id><token>": id is the
-- waiter's public id, 32 hex digits of which the first 16 are its client's, and token
-- the token it will hold the lock with ("<32 hex digits>@<owner label>", so status can
-- show the label without a key of its own).
--   {<lock key>}:queue  score = arrival ticket (1, 2, ...): the order of service
--   {<lock key>}:alive  score = the entry's deadline on Redis's clock (ms). A waiter
--                       heartbeats its entry every third of its waiter TTL; an entry
--                       past its deadline belongs to a waiter that died or hung.
--
-- The lock is never left free while a live waiter is queued: whoever frees it (a
-- release, a waiter leaving) or finds it free (an acquire) hands it to the first live
-- waiter — sets the lock to that waiter's token and tells it, "g <id> <fence> <ms>" (ms:
-- how long the lock is set for), on its client's channel (<channel prefix><client id>:
-- each client listens on its own, so
-- a hand-over reaches one process). The waiter holds the lock when it reads the
-- message, without a round trip of its own. Dead entries are dropped when they come to the head; the
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

-- tell(prefix, publish, member, what): sends waiter `member` the message "g <id> <what>"
-- on its client's channel
local function tell(prefix, publish, member, what)
  redis.call(publish, prefix .. string.sub(member, 1, 16), 'g ' .. string.sub(member, 1, 32) .. ' ' .. what)
end

-- hand_over(lock, queue, alive, counter, floor, prefix, publish, member, deadline,
-- ticket, now): gives the lock to the waiter `member` (taken off the queue by
-- next_live) until its deadline, with a fresh fencing token, and tells it. Returns nil,
-- or the error reply of a fencing counter of another type (the waiter is put back).
local function hand_over(lock, queue, alive, counter, floor, prefix, publish, member, deadline, ticket, now)
  local fence = take_fence(counter, floor)
  if type(fence) == 'table' then
    redis.call('ZADD', queue, ticket, member)
    redis.call('ZADD', alive, deadline, member)
    expire_at_least(queue, deadline - now)
    expire_at_least(alive, deadline - now)
    return fence
  end
  redis.call('SET', lock, string.sub(member, 33), 'PX', string.format('%d', math.max(deadline - now, 1)))
  -- (Fencing tokens are integers below 2^53: '%d' prints them exactly, and faster
  -- than the '%.17g' a number argument would be printed with.)
  -- With what the waiter may rely on: until its deadline, as the lock's PX says.
  tell(prefix, publish, member, string.format('%d %d', fence, math.max(deadline - now, 1)))
  return nil
end
