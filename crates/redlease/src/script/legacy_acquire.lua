-- legacy_acquire.lua: take a legacy timestamp lock the way old clients do, atomically.
--
-- KEYS[1]  lock key      <prefix><name>: "<unix time + timeout + 1>" (the old protocol)
-- KEYS[2]  owner key     {<lock key>}:legacy: "<stamp> <token>" (see legacy.lua)
-- ARGV[1]  token         this acquisition's random token (never stored in the lock key)
-- ARGV[2]  unit          's' (seconds, what old SETNX clients write) or 'ms'
-- ARGV[3]  timeout_ms    the lock timeout (a whole number of seconds for unit 's')
--
-- Reply: {1, remaining_ms}  acquired now, or already ours (a retry after a lost reply)
--        {0, wait_ms}       held by someone else; wait_ms is how long until its
--                           timestamp is older than Redis's clock (-1: the value is not
--                           a timestamp, so it is never taken over)
--
-- The three steps old clients send separately run here as one: SETNX when the key is
-- free; when it holds a timestamp older than now, the GETSET takeover (GET and SET in
-- one script cannot be split, so two takers never both win); else report the wait.
local stamp, value = owned(ARGV[1])
local unit = ARGV[2]
local now, now_ms = clock(unit)
if stamp then
  return {1, math.max(respected_ms(stamp, unit) - now_ms, 0)}
end
if value then
  local held = stamp_of(value)
  if not held then
    return {0, -1}
  end
  if held >= now then
    return {0, expires_ms(held, unit) - now_ms}
  end
end
return {1, write(ARGV[1], unit, tonumber(ARGV[3]), now, now_ms)}
