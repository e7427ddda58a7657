-- multi_release.lua: compare-and-delete several plain mutexes whose keys share one
-- hash slot — or hand each straight to a waiter registered for it — and wake a waiter
-- of each.
--
-- Each name goes through the plain mutex's own release step (mutex_release.lua,
-- wrapped as the function mutex_release(KEYS, ARGV) before this script), which hands
-- the name to its first registered waiter or publishes on its wake-up channel.
--
-- KEYS[1], KEYS[2], KEYS[3]  lock key, meta key and waiters of the first name;
--                            KEYS[3i-2], KEYS[3i-1], KEYS[3i] those of the i-th name
-- ARGV[1]    token     the holder's token
-- ARGV[2]    publish   'PUBLISH' (standalone) or 'SPUBLISH' (cluster)
-- ARGV[3]    claim_ms  how long a name handed to a waiter holds before it extends it
-- ARGV[4]    meta_px   the metadata's TTL for a waiter handed a name
-- ARGV[4+i]  channel   wake-up channel of the i-th name
--
-- Reply: {r_1, ..., r_n}, for each name what mutex_release.lua answers:
--         1  released (or handed over) by this call
--        -1  free, and this token was its last holder (an earlier attempt of this
--            release succeeded, or the lease expired)
--         0  the token does not hold it; nothing was changed
local released = {}
for i = 1, #KEYS / 3 do
  released[i] = mutex_release({KEYS[3 * i - 2], KEYS[3 * i - 1], KEYS[3 * i]},
    {ARGV[1], ARGV[4 + i], ARGV[2], ARGV[3], ARGV[4], ''})
end
return released
