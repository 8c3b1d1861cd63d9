-- acquire.lua: grant the lock if it is free and mint a fencing token, atomically.
--
-- KEYS[1]  lock key   string: the owner id of the current grant, with a PX lease
-- KEYS[2]  fence key  integer counter of grants for this key; never expires
-- KEYS[3]  wait mark  set when an attempt finds the lock held: the release must publish
-- ARGV[1]  owner id   a fresh uuid v4 per lock() call
-- ARGV[2]  lease      in milliseconds
--
-- Returns  {1, token}  granted; token is the counter after INCR, lifted to the server clock in
--                      microseconds (TIME) when the counter is behind it. If the lock already
--                      belongs to ARGV[1] (a retry after a reply was lost) the lease is re-armed
--                      and the current counter is returned: nobody else can have been granted since.
--          {0, pttl}   held by another owner; pttl is its remaining lease in ms (-1: no expiry).
--                      The wait mark is set, in the same atomic step, to outlive the caller's
--                      next unprompted attempt (at the holder's expiry), which sets it again.
--
-- The clock floor keeps tokens increasing where a plain counter goes back: after a restart
-- without persistence (the counter starts again at 0) and after a failover that lost the last
-- increments. It assumes the server clock never steps back by more than the time such an event
-- takes. Redis replicates script effects, so TIME before writes is allowed and replicas receive
-- the resulting SET, not the clock reading.
--
-- INCR runs before SET: scripts do not roll back, and a fence key that cannot be incremented
-- (a wrong type, an overflow) must fail the script before it leaves a lock behind.
local holder = redis.call('GET', KEYS[1])
if holder == false then
  local token = redis.call('INCR', KEYS[2])
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if token < floor then
    token = floor
    redis.call('SET', KEYS[2], string.format('%.0f', floor))
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
local pttl = redis.call('PTTL', KEYS[1])
redis.call('SET', KEYS[3], '1', 'PX', ARGV[2] + math.max(pttl, 0))
return {0, pttl}
