-- fair_queue.lua: shared prelude of the fair mutex scripts (after expiry.lua).
--
-- The queue is two sorted sets with the same members, "<id>:<label>": id is 16 hex
-- digits naming the waiter's own wake-up channel (<channel prefix><id>), label is its
-- owner label (shown by status; never a token).
--   {<lock key>}:queue  score = arrival ticket (1, 2, ...): the order of service
--   {<lock key>}:alive  score = the entry's deadline on Redis's clock (ms). A waiter
--                       heartbeats its entry every third of its waiter TTL; an entry
--                       past its deadline belongs to a waiter that died or hung, and is
--                       pruned by the next script that looks.
--
-- prune(queue, alive, now) -> whether the head of the queue changed
local function prune(queue, alive, now)
  local dead = redis.call('ZRANGEBYSCORE', alive, '-inf', now, 'LIMIT', 0, 256)
  if #dead == 0 then
    return false
  end
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  redis.call('ZREM', queue, unpack(dead))
  redis.call('ZREM', alive, unpack(dead))
  return redis.call('ZRANGE', queue, 0, 0)[1] ~= head
end

-- wake_head(lock, queue, prefix, publish): if the lock is free, tells the first waiter
-- (and only it) on its own channel.
local function wake_head(lock, queue, prefix, publish)
  if redis.call('EXISTS', lock) == 1 then
    return
  end
  local head = redis.call('ZRANGE', queue, 0, 0)[1]
  if head then
    redis.call(publish, prefix .. string.sub(head, 1, 16), '1')
  end
end

