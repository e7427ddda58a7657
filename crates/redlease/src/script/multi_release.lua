-- multi_release.lua: compare-and-delete several plain mutexes whose keys share one
-- hash slot, and wake a waiter of each.
--
-- Each name goes through the plain mutex's own release step (mutex_release.lua,
-- wrapped as the function mutex_release(KEYS, ARGV) before this script), which
-- publishes on that name's wake-up channel.
--
-- KEYS[1], KEYS[2]  lock key and meta key of the first name; KEYS[2i-1], KEYS[2i] those
--                   of the i-th name
-- ARGV[1]    token     the holder's token
-- ARGV[2]    publish   'PUBLISH' (standalone) or 'SPUBLISH' (cluster)
-- ARGV[2+i]  channel   wake-up channel of the i-th name
--
-- Reply: {r_1, ..., r_n}, for each name what mutex_release.lua answers:
--         1  released by this call
--        -1  free, and this token was its last holder (an earlier attempt of this
--            release succeeded, or the lease expired)
--         0  the token does not hold it; nothing was changed
local released = {}
for i = 1, #KEYS / 2 do
  released[i] = mutex_release({KEYS[2 * i - 1], KEYS[2 * i]}, {ARGV[1], ARGV[2 + i], ARGV[2]})
end
return released
