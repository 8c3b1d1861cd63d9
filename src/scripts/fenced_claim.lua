-- fenced_claim.lua: record a token as accepted without touching the value, unless a newer token
-- was accepted (fenced_prelude.lua is prepended). A new holder claims before it reads, so no
-- older holder can write after the read.
--
-- KEYS[1]  data key      not touched; every fenced script takes the same KEYS
-- KEYS[2]  accepted key  string: the highest token accepted for the resource; never deleted
-- ARGV[1]  token         decimal
--
-- Returns  {1, 1}        the accepted token is now ARGV[1]
--          {0, highest}  ARGV[1] is lower than the accepted token; nothing was changed
local refused = refuse_stale(KEYS[2], ARGV[1])
if refused then
  return refused
end
redis.call('SET', KEYS[2], ARGV[1])
return {1, 1}
