-- list_lock.lua: describe the lock at one key for `list`, whatever its kind, without
-- revealing a token. Read-only.
--
-- KEYS[1]  lock key    <prefix><name>
-- KEYS[2]  meta        {<lock key>}:meta: "<fence> <since_ms> <token> <label>" (the
--                      read-write lock's writer)
-- KEYS[3]  q           {<lock key>}:q: the plain mutex's waiters -> deadline (Redis ms)
-- KEYS[4]  queue       {<lock key>}:queue: the fair mutex's queue
-- KEYS[5]  alive       {<lock key>}:alive: fair waiter -> deadline
-- KEYS[6]  readers     {<lock key>}:readers: reader token -> lease deadline
-- KEYS[7]  writers     {<lock key>}:writers: waiting writer token -> deadline
-- KEYS[8]  limit       {<lock key>}:limit: a semaphore's permit limit
-- KEYS[9]  legacy      {<lock key>}:legacy: "<stamp> <token>" of redlease's legacy lock
-- KEYS[10] waiters     {<lock key>}:waiters: a semaphore's waiting acquisitions ->
--                      deadline
--
-- Reply: {kind, owner, pttl, fence, waiters, holders}
--   kind     'mutex' (redlease's plain mutex, or a fair mutex with nobody queued: they
--            hold the same token), 'exclusive' (the token and metadata of a read-write
--            lock's writer, with nobody reading or waiting to tell it), 'fair' (a fair
--            mutex with waiters queued), 'rwlock', 'semaphore', 'election', 'legacy',
--            'foreign' (a string in a format not redlease's: another library's lock),
--            or 'none' (nothing held here, or not a lock)
--   owner    the holder's owner label, or false
--   pttl     remaining lease in ms (-1: none)
--   fence    the holder's fencing token or term (a decimal string), or false
--   waiters  waiting clients; holders: how many hold (readers, permits; else 1)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

-- How many entries of a sorted set of deadlines are still live (0 for a key of
-- another type).
local function live(key)
  local n = redis.pcall('ZCOUNT', key, '(' .. now, '+inf')
  if type(n) == 'number' then
    return n
  end
  return 0
end

local function get(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'string' then
    return v
  end
  return nil
end

local kind = redis.call('TYPE', KEYS[1])['ok']
if kind == 'string' then
  local value = redis.call('GET', KEYS[1])
  local pttl = redis.call('PTTL', KEYS[1])
  local owner = plain_owner(value)
  if owner then
    if redis.call('EXISTS', KEYS[4]) == 1 then
      return {'fair', owner, pttl, false, live(KEYS[5]), 1}
    end
    return {'mutex', owner, pttl, false, live(KEYS[3]), 1}
  end
  local fence, since, token, label = string.match(get(KEYS[2]) or '', '^(%d+) (%d+) (%S+) ?(.*)$')
  if token and token == value then
    if live(KEYS[6]) > 0 or live(KEYS[7]) > 0 then
      return {'rwlock', label, pttl, fence, live(KEYS[7]), 1}
    end
    return {'exclusive', label, pttl, fence, 0, 1}
  end
  local stamp = string.match(get(KEYS[9]) or '', '^(%d+) ')
  if stamp and stamp == value then
    return {'legacy', false, pttl, false, 0, 1}
  end
  return {'foreign', false, pttl, false, live(KEYS[3]), 1}
end
if kind == 'hash' then
  local leader = redis.call('HMGET', KEYS[1], 'token', 'term', 'owner')
  if leader[1] and leader[2] then
    return {'election', leader[3] or false, redis.call('PTTL', KEYS[1]), leader[2], 0, 1}
  end
  return {'none', false, -1, false, 0, 0}
end
if kind == 'zset' and redis.call('EXISTS', KEYS[8]) == 1 then
  local permits = live(KEYS[1])
  if permits > 0 then
    return {'semaphore', false, redis.call('PTTL', KEYS[1]), false, live(KEYS[10]), permits}
  end
  return {'none', false, -1, false, 0, 0}
end
if kind == 'none' then
  local readers = live(KEYS[6])
  if readers > 0 then
    local last = redis.call('ZRANGE', KEYS[6], 0, 0, 'REV', 'WITHSCORES')
    local pttl = math.max(tonumber(last[2]) - now, 0)
    return {'rwlock', false, pttl, false, live(KEYS[7]), readers}
  end
end
return {'none', false, -1, false, 0, 0}
