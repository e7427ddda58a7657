-- expiry.lua: shared prelude of the scripts that keep leases as expiry scores.
--
-- Every stored deadline is a score on Redis's own clock (TIME), never the client's, so
-- a client whose clock drifts cannot make an entry live longer or shorter than its TTL.
--
-- server_ms() -> the server's time in milliseconds
local function server_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- expire_at_least(key, ms): the key lives at least ms more; a longer TTL is kept (the
-- entries of other holders may need it). One call when the TTL grows, as on every
-- renewal; up to three otherwise.
local function expire_at_least(key, ms)
  if redis.call('PEXPIRE', key, ms, 'GT') == 0 and redis.call('PTTL', key) == -1 then
    redis.call('PEXPIRE', key, ms)
  end
end

