-- multi_release.lua: compare-and-delete several plain mutexes whose keys share one
-- hash slot — or hand each straight to a waiter registered for it — waking the waiters
-- of each; and, for a multi-lock waiter that gives up, leave its registrations.
--
-- Each name goes through the plain mutex's own release step (mutex_release.lua,
-- wrapped as the function mutex_release(KEYS, ARGV) before this script): it hands the
-- name to its first registered waiter that takes hand-overs, or wakes its registered
-- waiters, or (with none registered) just deletes it.
--
-- KEYS[4i-3]  lock key      of the i-th name
-- KEYS[4i-2]  counter       the fencing counter of its hash slot (see mark.lua)
-- KEYS[4i-1]  floor         its floor
-- KEYS[4i]    waiters       {<lock key>}:q (its wake-up channel is {<lock key>}:wake)
-- (so KEYS[1] is the first name's lock key)
-- ARGV[1]    token         the holder's token
-- ARGV[2]    hand-over     '<publish> <claim_ms>': 'PUBLISH' (standalone) or 'SPUBLISH'
--                          (cluster), and how long a name handed to a waiter holds
--                          before it extends it
-- ARGV[3]    registration  (only for a multi-lock waiter that gives up) its
--                          registration to leave on every name ("<id>!", see
--                          multi_acquire.lua)
--
-- Reply: {r_1, ..., r_n}, for each name what mutex_release.lua answers:
--         1  released (or handed over) by this call
--        -1  free: an earlier attempt of this release succeeded (its reply was lost),
--            or the lease ran out, or the key was deleted
--         0  the token does not hold it, another token does; nothing was changed
--        or the error of a name's step (a counter key of another type when a name is
--        handed over): the names before it are released, it and those after are not
local released = {}
for i = 1, #KEYS / 4 do
  local one = mutex_release({KEYS[4 * i - 3], KEYS[4 * i - 2], KEYS[4 * i - 1], KEYS[4 * i]},
    {ARGV[1], ARGV[2], ARGV[3]})
  if type(one) == 'table' then
    return one
  end
  released[i] = one
end
return released
