-- extend.lua: re-arm the lease of a lock we still own (compare-and-pexpire).
--
-- KEYS[1]  lock key
-- ARGV[1]  owner id of our grant
-- ARGV[2]  lease in milliseconds
--
-- Returns  1  extended
--          0  the key is gone or belongs to another owner; nothing was changed
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
