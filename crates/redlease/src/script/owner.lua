-- owner.lua: shared prelude of the scripts that read who holds a plain mutex.
--
-- The one place that knows the plain mutex's token format: "<32 hex digits>@<owner
-- label>", written by redlease's mutex (token.rs, Token::for_owner). Anything else in a
-- lock key — a bare token, a number, another library's value — is not a plain mutex
-- holder of redlease's.

-- plain_owner(value) -> the owner label of a plain mutex token, or nil
local function plain_owner(value)
  if type(value) == 'string' and string.find(value, '^%x+@') == 1
      and string.find(value, '@', 1, true) == 33 then
    return string.sub(value, 34)
  end
  return nil
end
