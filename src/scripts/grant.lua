-- grant.lua: functions shared by acquire.lua and release.lua, prepended to both (not a script of
-- its own).
--
-- The queue of a key: KEYS[3] is a LIST of the owner ids waiting, oldest first; KEYS[4] a HASH
-- from each of those owner ids to "<expiry ms> <lease ms>". An entry past its expiry (server
-- clock) belongs to a waiter that stopped asking and is skipped; both keys expire with their
-- longest-lived entry.

local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- Sets the lock to `owner` for `lease` ms and returns its fencing token: the fence counter after
-- INCR, lifted to the server clock in microseconds (TIME) when the counter is behind it.
--
-- The clock floor keeps tokens increasing where a plain counter goes back: after a restart
-- without persistence (the counter starts again at 0) and after a failover that lost the last
-- increments. It assumes the server clock never steps back by more than the time such an event
-- takes. Redis replicates script effects, so TIME before writes is allowed and replicas receive
-- the resulting SET, not the clock reading.
--
-- INCR runs before SET: scripts do not roll back, and a fence key that cannot be incremented
-- (a wrong type, an overflow) must fail the script before it leaves a lock behind.
local function grant(lock, fence, owner, lease)
  local token = redis.call('INCR', fence)
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if token < floor then
    token = floor
    redis.call('SET', fence, string.format('%.0f', floor))
  end
  redis.call('SET', lock, owner, 'PX', lease)
  return token
end

-- Puts `owner` at the back of the queue, or refreshes its entry where it already stands. The
-- entry lives `wait` ms (until the current holder's lease runs out, when the waiter asks again
-- by itself) plus the waiter's own lease.
local function enqueue(queue, entries, owner, lease, wait)
  local ttl = wait + tonumber(lease)
  local entry = string.format('%.0f %s', now_ms() + ttl, lease)
  if redis.call('HSET', entries, owner, entry) == 1 then
    redis.call('RPUSH', queue, owner)
  end
  if redis.call('PTTL', queue) < ttl then
    redis.call('PEXPIRE', queue, ttl)
    redis.call('PEXPIRE', entries, ttl)
  end
end

-- Takes `owner` out of the queue, if it stands there.
local function dequeue(queue, entries, owner)
  if redis.call('HDEL', entries, owner) == 1 then
    redis.call('LREM', queue, 1, owner)
  end
end
