-- release.lua: delete a lock we still own and wake waiters (compare-and-delete + publish).
--
-- KEYS[1]  lock key
-- ARGV[1]  owner id of our grant
-- ARGV[2]  release channel of the namespace
-- ARGV[3]  message: the escaped user key, so subscribers know which key came free
--
-- Returns  1  released, and the release published
--          0  the key is gone or belongs to another owner; nothing was deleted or published
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], ARGV[3])
  return 1
end
return 0
