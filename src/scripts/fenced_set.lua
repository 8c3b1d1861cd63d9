-- fenced_set.lua: store a value unless a newer token was accepted, and record the token
-- (fenced_prelude.lua is prepended).
--
-- KEYS[1]  data key      string: the resource's value
-- KEYS[2]  accepted key  string: the highest token accepted for the resource; never deleted
-- ARGV[1]  token         decimal
-- ARGV[2]  value         bytes
--
-- Returns  {1, 1}        written; the accepted token is now ARGV[1]
--          {0, highest}  ARGV[1] is lower than the accepted token; nothing was changed
local refused = refuse_stale(KEYS[2], ARGV[1])
if refused then
  return refused
end
redis.call('SET', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[1])
return {1, 1}
