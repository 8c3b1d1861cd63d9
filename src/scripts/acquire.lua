-- acquire.lua: grant the lock if it is free and mint a fencing token, atomically.
--
-- KEYS[1]  lock key   string: the owner id of the current grant, with a PX lease
-- KEYS[2]  fence key  integer counter of grants for this key; never expires
-- ARGV[1]  owner id   a fresh uuid v4 per lock() call
-- ARGV[2]  lease      in milliseconds
--
-- Returns  {1, token}  granted; token is the counter after INCR. If the lock already belongs
--                      to ARGV[1] (a retry after a reply was lost) the lease is re-armed and the
--                      current counter is returned: nobody else can have been granted since.
--          {0, pttl}   held by another owner; pttl is its remaining lease in ms (-1: no expiry)
-- Errors   if the fence key holds no positive integer: nothing is set then. (Scripts do not
--          roll back, so INCR runs before SET: a failing INCR must not leave a lock behind.)
local holder = redis.call('GET', KEYS[1])
if holder == false then
  local token = redis.call('INCR', KEYS[2])
  if token < 1 then
    return redis.error_reply('ERR fencelock: fence counter ' .. KEYS[2] .. ' is not positive')
  end
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, token}
end
if holder == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local token = redis.call('GET', KEYS[2])
  if token == false then
    token = redis.call('INCR', KEYS[2])
  end
  return {1, token}
end
return {0, redis.call('PTTL', KEYS[1])}
