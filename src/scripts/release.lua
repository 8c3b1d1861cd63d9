-- release.lua: delete a lock we still own and, if anyone waits, wake them (compare-and-delete,
-- then publish).
--
-- KEYS[1]  lock key
-- KEYS[2]  wait mark, set by every attempt that found the lock held
-- ARGV[1]  owner id of our grant
-- ARGV[2]  release channel of the namespace
-- ARGV[3]  message: the escaped user key, so subscribers know which key came free
--
-- Returns  2  released, and published: someone had found the lock held (the mark is cleared;
--             waiters that lose the race set it again)
--          1  released; nobody marked waiting, so nothing was published
--          0  the key is gone or belongs to another owner; nothing was deleted or published
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if redis.call('DEL', KEYS[2]) == 1 then
    redis.call('PUBLISH', ARGV[2], ARGV[3])
    return 2
  end
  return 1
end
return 0
