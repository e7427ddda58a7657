-- cas.lua: compare-and-set one string key on the server, in one atomic step.
--
-- KEYS[1]  key           any string key of the application
-- ARGV[1]  expect        'v': the key must hold ARGV[2]; 'n': the key must not exist
-- ARGV[2]  expected      the value the key must hold (ignored for 'n')
-- ARGV[3]  action        'v': set the key to ARGV[4], keeping its TTL; 'd': delete it
-- ARGV[4]  new           the new value (ignored for 'd')
--
-- Reply: 1              the key matched and was changed
--        {0, current}   the key did not match and was left alone; current is its
--                       value (nil when absent), so the caller can retry without a GET
--
-- Two calls. Not idempotent by itself: a retry of a request that landed finds the new
-- value and replies {0, new}; callers that retry compare `current` with their new value.
local current = redis.call('GET', KEYS[1])
local matches
if ARGV[1] == 'n' then
  matches = not current
else
  matches = current == ARGV[2]
end
if not matches then
  return {0, current}
end
if ARGV[3] == 'd' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[4], 'KEEPTTL')
end
return 1
