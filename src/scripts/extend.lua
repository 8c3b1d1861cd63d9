-- extend.lua: re-arm the lease of a lock we still own (compare-and-pexpire, never shortening).
--
-- KEYS[1]  lock key
-- ARGV[1]  owner id of our grant
-- ARGV[2]  lease in milliseconds
--
-- Returns  1  ours: the lease runs at least ARGV[2] ms from now (re-armed unless it already ran
--             longer: a late extend must not cut short what a newer one set)
--          0  the key is gone or belongs to another owner; nothing was changed
if redis.call('GET', KEYS[1]) == ARGV[1] then
  -- Written even when the lease already runs longer (then to what it was): a WAIT behind this
  -- call counts the replicas that have this connection's writes, and from Redis 7.2 on, a
  -- connection that wrote nothing has nothing to wait for, so WAIT would count every replica
  -- connected, however far behind.
  redis.call('PEXPIRE', KEYS[1], math.max(redis.call('PTTL', KEYS[1]), tonumber(ARGV[2])))
  return 1
end
return 0
