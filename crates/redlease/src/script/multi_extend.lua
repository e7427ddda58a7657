-- multi_extend.lua: renew or extend the lease of a holder of several plain mutexes
-- whose keys share one hash slot.
--
-- Each name goes through the plain mutex's own extend step (mutex_extend.lua, wrapped
-- as the function mutex_extend(KEYS, ARGV) before this script).
--
-- KEYS[1]  lock key of the first name; KEYS[i] that of the i-th name (only keys that
--          exist while the names are held: a slot migration does not refuse them)
-- ARGV[1]  token         the holder's token
-- ARGV[2]  ttl_ms        every lease lasts at least this long from now (always the last
--                        argument)
--
-- Reply: 1  the token holds every name; each TTL is now at least ttl_ms
--        0  the token no longer holds some name (released, expired or taken over):
--           the lease over all of them is over, and the holder releases the rest
--
-- Never shortens a lease, and a retry changes nothing more (see mutex_extend.lua).
local held = 1
for i = 1, #KEYS do
  if mutex_extend({KEYS[i]}, ARGV) ~= 1 then
    held = 0
  end
end
return held
