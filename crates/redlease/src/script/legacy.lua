-- legacy.lua: shared prelude of the legacy timestamp-lock scripts.
--
-- The old protocol (the locking pattern of the Redis SETNX documentation page): the lock key
-- holds "<unix time + timeout + 1>" in seconds (unit 's') or milliseconds (unit 'ms').
-- Old clients take a free lock with SETNX, take over one whose timestamp is older than
-- their clock with GET + GETSET (winning only if GETSET returned the expired value), and
-- release with DEL. They never set a TTL.
--
-- redlease speaks that protocol but reads the time from Redis (TIME), and also records
-- which of its acquisitions wrote the timestamp: the owner record {<key>}:legacy holds
-- "<stamp> <token>", and the lock key gets a PXAT expiry one second after its stamp
-- runs out. The lock is redlease acquisition <token>'s only while all three agree: the
-- key holds <stamp>, the key has a TTL (SETNX and GETSET by an old client leave none),
-- and the owner record says "<stamp> <token>". So an equal timestamp written by an old
-- client after a DEL, or by another redlease acquisition in the same second, is never
-- mistaken for ours.

-- clock(unit) -> now in the unit, now in milliseconds (Redis's clock)
local function clock(unit)
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if unit == 's' then
    return tonumber(t[1]), ms
  end
  return ms, ms
end

-- stamp_of(value) -> the timestamp, or nil when the value is not a plain number
-- (a lock in another format is never taken over)
local function stamp_of(value)
  if value and #value <= 20 and (string.match(value, '^%d+$') or string.match(value, '^%d+%.%d+$')) then
    return tonumber(value)
  end
  return nil
end

-- expires_ms(stamp, unit) -> the first millisecond at which the stamp is older than
-- the current time, i.e. the lock counts as expired
local function expires_ms(stamp, unit)
  if unit == 's' then
    return (math.floor(stamp) + 1) * 1000
  end
  return math.floor(stamp) + 1
end

-- respected_ms(stamp, unit) -> the instant up to which every old client respects the
-- stamp, whether it treats "stamp == now" as expired (as some do) or only "stamp < now"
local function respected_ms(stamp, unit)
  if unit == 's' then
    return stamp * 1000
  end
  return stamp
end

-- owned(token) -> stamp, value
-- stamp: the timestamp when the lock is this acquisition's, else nil;
-- value: whatever the lock key holds (nil when absent)
local function owned(token)
  local value = redis.call('GET', KEYS[1])
  if not value or redis.call('GET', KEYS[2]) ~= value .. ' ' .. token then
    return nil, value
  end
  if redis.call('PTTL', KEYS[1]) < 0 then
    return nil, value
  end
  return tonumber(value), value
end

-- write(token, unit, timeout_ms, now, now_ms) -> remaining_ms
-- Stores stamp = now + timeout + 1 (the old protocol's value) for this acquisition and
-- returns how long other clients will respect it: until the stamp itself, by Redis's
-- clock (a client treating "stamp == now" as expired takes over from then on).
-- next_stamp(unit, timeout_ms, now) -> now + timeout + 1, in the unit
local function next_stamp(unit, timeout_ms, now)
  local span = timeout_ms
  if unit == 's' then
    span = math.ceil(timeout_ms / 1000)
  end
  return now + span + 1
end

local function write(token, unit, timeout_ms, now, now_ms)
  local stamp = next_stamp(unit, timeout_ms, now)
  local value = string.format('%.0f', stamp)
  local at = expires_ms(stamp, unit) + 1000
  redis.call('SET', KEYS[1], value, 'PXAT', at)
  redis.call('SET', KEYS[2], value .. ' ' .. token, 'PXAT', at)
  return respected_ms(stamp, unit) - now_ms
end

