-- sem_waiters.lua: shared prelude of the semaphore scripts that register waiters or
-- hand out permits (after mark.lua and expiry.lua).
--
-- A waiter that finds too few permits free registers in {<key>}:waiters, scored with
-- the registration's deadline (Redis ms; it tries again before that), as
-- "<id><token><count>/<limit>": id is its public id, 32 hex digits of which the first
-- 16 are its client's; token the acquisition's 32 hex digits; count the permits it
-- wants, under its limit. A release hands the room it makes straight to registered
-- waiters, earliest deadline first, each that fits in what is free and has the limit
-- in force (one with another limit learns of it on its next attempt): it adds
-- the waiter's permits for a claim window, issues a fencing token (a mark, not exposed:
-- it tells a current hand-over from one made before the waiter's last attempt), and
-- tells it "g <id> <fence> <claim_ms>" on its client's channel (<channel prefix><client
-- id>; the claim is the releaser's, which the waiter's handle may not share). The
-- waiter holds the permits when it reads the message, without a request of its own, and
-- its renewal extends them to its full lease. A waiter that died after registering holds
-- its permits up for at most the claim window.

-- add_permits(permits, token, count, deadline): the acquisition's permits are
-- <token>:1 ..= <token>:count, each scored with its lease deadline (a string). GT: a
-- permit already held keeps a later deadline — never shortened under its holder.
local function add_permits(permits, token, count, deadline)
  local args = {}
  for i = 1, count do
    args[2 * i - 1] = deadline
    args[2 * i] = token .. ':' .. i
  end
  redis.call('ZADD', permits, 'GT', unpack(args))
end

-- hand_out(permits, limit, waiters, counter, floor, limit_arg, prefix, publish, claim_ms,
-- free, now) -> the permits still free, or the error reply of a fencing counter of
-- another type: gives `free` permits to registered waiters that fit under limit
-- `limit_arg` (the one in force), looking at up to 16 registrations (one at a time:
-- the first one usually fits), and drops the dead ones among them
local function hand_out(permits, limit, waiters, counter, floor, limit_arg, prefix, publish, claim, free, now)
  local given = 0
  local at = 0
  for _ = 1, 16 do
    if free <= 0 then
      break
    end
    local r = redis.call('ZRANGE', waiters, at, at, 'WITHSCORES')
    local reg = r[1]
    if not reg then
      break
    end
    if tonumber(r[2]) <= now then
      redis.call('ZREM', waiters, reg)
    else
      local count, wants = string.match(reg, '^(%d+)/(%d+)$', 65)
      count = tonumber(count)
      if count and count <= free and wants == limit_arg then
        local fence = take_fence(counter, floor)
        if type(fence) == 'table' then
          return fence
        end
        add_permits(permits, string.sub(reg, 33, 64), count, string.format('%d', now + tonumber(claim)))
        redis.call('ZREM', waiters, reg)
        redis.call(publish, prefix .. string.sub(reg, 1, 16),
          'g ' .. string.sub(reg, 1, 32) .. ' ' .. string.format('%d', fence) .. ' ' .. claim)
        free = free - count
        given = given + count
      else
        at = at + 1
      end
    end
  end
  if given > 0 then
    -- The permits and the limit live at least as long as the handed-out permits. (The
    -- permits' set had a TTL unless we created it, when no permit was left.)
    if free + given == tonumber(limit_arg) then
      redis.call('PEXPIRE', permits, claim)
    else
      redis.call('PEXPIRE', permits, claim, 'GT')
    end
    -- (The limit in force may still be stored as another one when no permit was held
    -- before this hand-out — the key outlives a released holder's permits: the
    -- permits handed out make this one the limit.)
    if redis.call('GET', limit) ~= limit_arg or redis.call('PTTL', limit) < tonumber(claim) then
      redis.call('SET', limit, limit_arg, 'PX', claim)
    end
  end
  return free
end
