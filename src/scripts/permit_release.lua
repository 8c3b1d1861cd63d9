-- permit_release.lua: give back a permit we still hold, handing it straight to the oldest live
-- waiter if there is one; also how a waiter that gives up leaves the queue. (grant.lua and
-- shared_lock.lua are prepended.)
--
-- KEYS[1..6]  as permit_acquire.lua: holders, fence, queue, entries, limit, and the permit key
--             of ARGV[1]
-- ARGV[1]  owner id of the permit being released
-- ARGV[2]  '0': a holder's release; '1': ARGV[1] is a waiter giving up: leave the queue first,
--          then release the permit if a handoff reached it meanwhile
-- ARGV[3]  idle: ms the fence counter outlives the clock's passing it, re-armed by a handoff
--
-- Returns, in the shape of rw_release.lua's reply:
--          {0}                       the permit key is gone or not ARGV[1]'s: nothing released
--                                    (ARGV[1] is taken out of the holders: it counts no more)
--          {1}                       released; nobody waits
--          {1, token, owner, lease}  released and handed to `owner`, the oldest live entry of
--                                    the queue: its permit key is set for `lease` ms (its entry's
--                                    lease, at most HANDOFF_LEASE until it confirms), and it is
--                                    among the holders with its token (a decimal string). Unless
--                                    `owner` is one of the caller's (its id starts like ARGV[1],
--                                    up to the ':'), its client is told (tell in grant.lua).
--
-- A handoff passes the released permit on: the count of holders stays what it was.
local holders, fence, queue, entries, limit, permit = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local owner, idle = ARGV[1], ARGV[3]
if ARGV[2] == '1' then
  dequeue(queue, entries, owner)
end
if redis.call('GET', permit) ~= owner then
  redis.call('ZREM', holders, owner)
  return {0}
end
redis.call('DEL', permit)
redis.call('ZREM', holders, owner)
local prefix = string.sub(permit, 1, #permit - #owner)
local now
-- Ends with the queue: every entry popped is either granted or gone (a dead waiter's).
while true do
  local next = redis.call('LPOP', queue)
  if not next then
    break
  end
  local entry = redis.call('HGET', entries, next)
  if entry then
    redis.call('HDEL', entries, next)
  end
  local expiry, lease = string.match(entry or '', '^(%d+) (%d+)$')
  if expiry and next ~= owner then
    now = now or now_ms()
    if tonumber(expiry) > now then
      -- The waiter may have died while queued: it has HANDOFF_LEASE to confirm the grant.
      lease = math.min(tonumber(lease), HANDOFF_LEASE)
      local token = mint(fence, idle)
      redis.call('ZADD', holders, token, next)
      redis.call('SET', prefix .. next, next, 'PX', lease)
      tell(holders, owner, next, token)
      return {1, token, next, lease}
    end
  end
end
if redis.call('ZCARD', holders) == 0 then
  -- Nobody holds or waits: the next caller's count is the one in force.
  redis.call('DEL', limit)
end
return {1}
