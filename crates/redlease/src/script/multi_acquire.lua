-- multi_acquire.lua: take several plain mutexes whose keys share one hash slot, all of
-- them or none; a waiter that finds some held registers on those, to be woken by their
-- releases.
--
-- Each name is taken by the plain mutex's own acquire step (mutex_acquire.lua, wrapped
-- as the function mutex_acquire(KEYS, ARGV) before this script), so its key, its value
-- and its fencing token are exactly what a plain mutex of that name writes.
--
-- KEYS[4i-3]  lock key      of the i-th name, <prefix><name>
-- KEYS[4i-2]  counter       the fencing counter of its hash slot (see mark.lua); names
--                           of one slot share it, and get distinct, rising tokens
-- KEYS[4i-1]  floor         its floor
-- KEYS[4i]    waiters       {<lock key>}:q, the name's registered waiters (see
--                           mutex_acquire.lua)
-- (so KEYS[1] is the first name's lock key)
-- ARGV[1]  token         this acquisition's token (the same for every name)
-- ARGV[2]  ttl_ms        lease length in milliseconds
-- ARGV[3]  registration  '' for an attempt that only tries; for a waiter, its entry in
--                        the waiters of a name: "<id>!" (16 hex digits and the kind of
--                        a waiter a release only wakes: a multi-lock needs every name at
--                        once, so a release must not hand it one)
-- ARGV[4]  register_ms   how long a registration lives without a new attempt
--
-- Reply: {1, fence_1, pttl_1, ..., fence_n, pttl_n}
--            every name is held by the token: taken now (pttl_i = ttl_ms), or already
--            ours (a retry after a lost reply, with what is left and a fresh fence);
--            the registration is left on every name
--        {0, i, pttl_i, foreign_i, j, pttl_j, foreign_j, ...}
--            names i, j, ... are held by someone else, for pttl more (-1: no TTL); no
--            name was taken. foreign is 1 when the holder is not a redlease plain
--            mutex (its token is not "<32 hex>@<label>", or the key has no TTL), whose
--            release announces nothing: the waiter polls. A waiter is registered on
--            exactly those names (and has left the others): their releases wake it
--
-- All or nothing: every lock key is read before anything is written, so a name held
-- by someone else or a lock key of the wrong type (WRONGTYPE) stops the script before
-- its first write, and a waiters key of the wrong type before any name is taken. A
-- counter key of another type fails the script after the names taken by it are
-- deleted again.
local n = #KEYS / 4
local busy = {0}
local is_busy = {}
for i = 1, n do
  local holder = redis.call('GET', KEYS[4 * i - 3])
  if holder and holder ~= ARGV[1] then
    is_busy[i] = true
    local pttl = redis.call('PTTL', KEYS[4 * i - 3])
    local foreign = 0
    if pttl == -1 or string.byte(holder, 33) ~= 64 then
      foreign = 1
    end
    busy[#busy + 1] = i
    busy[#busy + 1] = pttl
    busy[#busy + 1] = foreign
  end
end
if #busy > 1 then
  if ARGV[3] ~= '' then
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local life = tonumber(ARGV[4])
    for i = 1, n do
      local q = KEYS[4 * i]
      if is_busy[i] then
        redis.call('ZADD', q, now + life, ARGV[3])
        redis.call('PEXPIRE', q, life, 'GT')
        if redis.call('PTTL', q) == -1 then
          redis.call('PEXPIRE', q, life)
        end
      else
        redis.call('ZREM', q, ARGV[3])
      end
    end
  end
  return busy
end
if ARGV[3] ~= '' then
  for i = 1, n do
    redis.call('ZREM', KEYS[4 * i], ARGV[3])
  end
end
local held = {1}
local taken_now = {}
local try = {ARGV[1], ARGV[2], '', '0', ARGV[4]}
for i = 1, n do
  local one = mutex_acquire({KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]}, try)
  if type(one) == 'number' then
    taken_now[#taken_now + 1] = KEYS[4 * i - 3]
    held[#held + 1] = one
    held[#held + 1] = tonumber(ARGV[2])
  elseif one[1] == 1 then
    held[#held + 1] = one[2]
    held[#held + 1] = one[3]
  else
    -- A counter key of another type (the step gave this name back already): give back
    -- the names this call took, and fail. (A name free when the script began cannot
    -- be busy now.)
    for _, key in ipairs(taken_now) do
      redis.call('DEL', key)
    end
    if one.err then
      return one
    end
    return redis.error_reply('ERR redlease: a name of a multi-lock changed during its acquire')
  end
end
return held
