-- fenced_incrby.lua: add to an integer value unless a newer token was accepted; record the token
-- (fenced_prelude.lua is prepended).
--
-- KEYS[1]  data key      string holding a 64-bit integer, or absent (counts as 0)
-- KEYS[2]  accepted key  string: the highest token accepted for the resource; never deleted
-- ARGV[1]  token         decimal
-- ARGV[2]  delta         decimal, may be negative
--
-- Returns  {1, value}    the value after the addition; the accepted token is now ARGV[1]
--          {0, highest}  ARGV[1] is lower than the accepted token; nothing was changed
-- Errors   if the value is not an integer or the sum overflows: INCRBY fails before the token is
--          recorded, so nothing is changed. (Scripts do not roll back: the write that can fail
--          goes first.)
local refused = refuse_stale(KEYS[2], ARGV[1])
if refused then
  return refused
end
local value = redis.call('INCRBY', KEYS[1], ARGV[2])
redis.call('SET', KEYS[2], ARGV[1])
return {1, value}
