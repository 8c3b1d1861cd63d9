-- fenced_delete.lua: delete the value unless a newer token was accepted; keep and raise the
-- accepted token, so a stale writer cannot write again once the value is gone (fenced_prelude.lua
-- is prepended).
--
-- KEYS[1]  data key      the resource's value
-- KEYS[2]  accepted key  string: the highest token accepted for the resource; never deleted
-- ARGV[1]  token         decimal
--
-- Returns  {1, deleted}  deleted is 1 if there was a value, 0 if not; the accepted token is now
--                        ARGV[1] either way
--          {0, highest}  ARGV[1] is lower than the accepted token; nothing was changed
local refused = refuse_stale(KEYS[2], ARGV[1])
if refused then
  return refused
end
local deleted = redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], ARGV[1])
return {1, deleted}
