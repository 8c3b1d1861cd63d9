-- rw_release.lua: give back a read or write grant we still hold, then admit the waiters at the
-- head of the queue that may hold now, in the same script; also how a waiter that gives up leaves
-- the queue. (grant.lua, shared_lock.lua and rw.lua are prepended.)
--
-- KEYS[1..6]  as rw_acquire.lua: readers, fence, queue, entries, writers, and the hold key of
--             ARGV[1]
-- ARGV[1]  owner id of the grant being released
-- ARGV[2]  '0': a holder's release; '1': ARGV[1] is a waiter giving up: leave the queue first,
--          then release the grant if a handoff reached it meanwhile
-- ARGV[3]  idle: ms the fence counter outlives the clock's passing it, re-armed by a grant
--
-- Returns  {code, token, owner, lease, token, owner, lease, ...}
--          code     0: the hold key was gone or not ARGV[1]'s, nothing released (ARGV[1] is taken
--                   out of the holders: it counts no more); 1: released
--          then each waiter admitted (admit in rw.lua): every live reader at the head of the
--          queue up to the first live writer, or that writer alone once nobody holds. Each is
--          among the holders with its token (a decimal string), its key set for `lease` ms, and
--          told through its client's channel unless that client is the caller's.
--
-- Admitting runs whatever the code: a grant whose lease ran out, or a writer leaving the head of
-- the queue, may let waiters in as a release does.
local readers, fence, queue, entries, writers, hold = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local owner, idle = ARGV[1], ARGV[3]
if ARGV[2] == '1' then
  dequeue(queue, entries, owner)
end
local code = 0
if redis.call('GET', hold) == owner then
  redis.call('DEL', hold)
  code = 1
end
redis.call('ZREM', readers, owner)
redis.call('ZREM', writers, owner)
local prefix = string.sub(hold, 1, #hold - #owner)
local reply = {code}
for _, v in ipairs(admit(readers, writers, fence, queue, entries, prefix, idle, owner)) do
  reply[#reply + 1] = v
end
return reply
