-- rw_acquire.lua: take a read-write lock to read or to write if the caller may hold it now, and
-- mint a fencing token, atomically; otherwise, for a waiter, join the queue. (grant.lua,
-- shared_lock.lua and rw.lua are prepended.)
--
-- KEYS[1]  readers  ZSET owner id -> token of every read grant not released (rw.lua)
-- KEYS[2]  fence    the lock's fence counter, for reads and writes (see mint in grant.lua)
-- KEYS[3]  queue    LIST of waiting owner ids, oldest first (see grant.lua)
-- KEYS[4]  entries  HASH owner id -> "<expiry ms> <lease ms> <r|w>"
-- KEYS[5]  writers  ZSET owner id -> token of every write grant not released
-- KEYS[6]  hold     the caller's key: "<namespace>:rwhold:{<tag>}:" .. ARGV[1]
-- ARGV[1]  owner id, fresh for every acquire call: "<client id>:<sequence>"
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  '0': a single try, never queued; '1': a waiter's first attempt: join the queue if
--          refused; '2': a waiter that may stand in the queue: join or refresh its entry if
--          refused, take it out if granted
-- ARGV[4]  idle: ms the fence counter outlives the clock's passing it
-- ARGV[5]  'r' to read, 'w' to write
--
-- Returns  {1, token}  granted: the hold key holds ARGV[1] with the lease, ARGV[1] is among the
--                      readers or the writers, scored by the token (a decimal string). If the
--                      grant is ours already (a retry after a lost reply, or a release handed it
--                      to us), its lease is re-armed (never shortened) and its token returned.
--          {0, pttl}   refused: a writer holds; or, to write, a reader holds; or a waiter before
--                      the caller goes first (see rw.lua). pttl: ms until the soonest lease of a
--                      holder in the way runs out (-1: none has an expiry), or HANDOFF_LEASE when
--                      only waiters are in the way; a waiter asks again by itself then.
local readers, fence, queue, entries, writers, hold = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local owner, lease, mode, idle, access = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local mine = access == 'w' and writers or readers
local prefix = string.sub(hold, 1, #hold - #owner)

local already = held_already(hold, mine, owner, lease)
if already then
  return {1, already}
end

local blocked, wait = false, -1
local writing, soonest = live(writers, prefix)
if writing > 0 then
  blocked, wait = true, soonest
elseif access == 'w' then
  local reading, soonest_read = live(readers, prefix)
  if reading > 0 then
    blocked, wait = true, soonest_read
  elseif waiting_before(queue, entries, owner, 1) > 0 then
    blocked, wait = true, HANDOFF_LEASE
  end
elseif writer_before(queue, entries, owner) then
  blocked, wait = true, HANDOFF_LEASE
end
if not blocked then
  local token = mint(fence, idle)
  -- The holder before its key: should the SET fail, a member without a key counts for nothing,
  -- where a key without a member would be a grant nobody counts.
  redis.call('ZADD', mine, token, owner)
  redis.call('SET', hold, owner, 'PX', lease)
  if mode == '2' then
    dequeue(queue, entries, owner)
  end
  return {1, token}
end
if mode ~= '0' then
  enqueue(queue, entries, owner, lease, math.max(wait, 0), access)
end
return {0, wait}
