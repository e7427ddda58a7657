-- multi_acquire.lua: take several plain mutexes whose keys share one hash slot, all of
-- them or none.
--
-- Each name is taken by the plain mutex's own acquire step (mutex_acquire.lua, wrapped
-- as the function mutex_acquire(KEYS, ARGV) before this script), so its key, its
-- metadata and its fencing token are exactly what a plain mutex of that name writes.
--
-- KEYS[1], KEYS[2]  lock key and meta key of the first name; KEYS[2i-1], KEYS[2i] those
--                   of the i-th name (as mutex_acquire.lua takes them)
-- ARGV[1]  token         this acquisition's random token (the same for every name)
-- ARGV[2]  ttl_ms        lease length in milliseconds
-- ARGV[3]  tail          " <token> <label>": the end of each name's metadata (label: the
--                        owner's, such as host:pid)
-- ARGV[4]  meta_px       the metadata's TTL: ttl_ms plus how long it outlives the lease
--
-- A multi-lock waiter does not register for a hand-over (a release hands a plain
-- mutex to one waiter of that name alone), so the plain step runs as an attempt that
-- only tries, and never touches the name's waiters.
-- Reply: {1, fence_1, pttl_1, ..., fence_n, pttl_n}  (a fence as an integer or a
--            decimal string)
--            every name is held by the token: taken now (pttl_i = ttl_ms), or already
--            ours (a retry after a lost reply, with what is left and the fence it got)
--        {0, i, pttl_i, j, pttl_j, ...}
--            names i, j, ... are held by someone else, for pttl more (-1: no TTL);
--            nothing was changed
--
-- All or nothing: every key is read before anything is written, so a name held by
-- someone else or a key of the wrong type (WRONGTYPE) stops the script before its
-- first write.
local busy = {0}
for i = 1, #KEYS / 2 do
  local holder = redis.call('GET', KEYS[2 * i - 1])
  redis.call('GET', KEYS[2 * i])
  if holder and holder ~= ARGV[1] then
    busy[#busy + 1] = i
    busy[#busy + 1] = redis.call('PTTL', KEYS[2 * i - 1])
  end
end
if #busy > 1 then
  return busy
end
local held = {1}
local try = {ARGV[1], ARGV[2], ARGV[3], ARGV[4], '', '0', '0'}
for i = 1, #KEYS / 2 do
  local one = mutex_acquire({KEYS[2 * i - 1], KEYS[2 * i]}, try)
  if type(one) ~= 'table' then
    held[#held + 1] = one
    held[#held + 1] = tonumber(ARGV[2])
  elseif one[1] == 1 then
    held[#held + 1] = one[2]
    held[#held + 1] = one[3]
  else
    -- Cannot happen: every name was free or ours when the script began.
    return redis.error_reply('ERR redlease: a name of a multi-lock changed during its acquire')
  end
end
return held
