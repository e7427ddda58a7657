-- multi_extend.lua: renew or extend the lease of a holder of several plain mutexes
-- whose keys share one hash slot.
--
-- Each name goes through the plain mutex's own extend step (mutex_extend.lua, wrapped
-- as the function mutex_extend(KEYS, ARGV) before this script).
--
-- KEYS[1], KEYS[2]  lock key and meta key of the first name; KEYS[2i-1], KEYS[2i] those
--                   of the i-th name
-- ARGV[1]  token         the holder's token
-- ARGV[2]  retention_ms  how long the metadata outlives the lease
-- ARGV[3]  ttl_ms        every lease lasts at least this long from now (always the last
--                        argument)
--
-- Reply: 1  the token holds every name; each TTL is now at least ttl_ms
--        0  the token no longer holds some name (released, expired or taken over):
--           the lease over all of them is over, and the holder releases the rest
--
-- Never shortens a lease, and a retry changes nothing more (see mutex_extend.lua).
local held = 1
for i = 1, #KEYS / 2 do
  if mutex_extend({KEYS[2 * i - 1], KEYS[2 * i]}, ARGV) ~= 1 then
    held = 0
  end
end
return held
