-- fenced_incrby.lua: add to an integer value unless a newer token was accepted; record the token
-- (fenced_prelude.lua is prepended).
--
-- KEYS[1]  data key      string holding a 64-bit integer, or absent (counts as 0)
-- KEYS[2]  accepted key  string: the highest token accepted for the resource; never deleted
-- ARGV[1]  token         decimal
-- ARGV[2]  delta         decimal, may be negative
--
-- Returns  {1, value}    the value after the addition (an integer, or beyond 2^53 its decimal
--                        string, read back with GET); the accepted token is now ARGV[1]
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
-- INCRBY's reply reaches Lua as a double, exact only within 2^53 (returned as it is, it would
-- round, and i64::MAX would wrap to i64::MIN): beyond, only GET gives the stored digits. A value
-- beyond 2^53 rounds to one at least that far out, so the test below is exact.
if value >= 9007199254740992 or value <= -9007199254740992 then
  value = redis.call('GET', KEYS[1])
end
return {1, value}
