-- permit_acquire.lua: take a permit of a counting semaphore if one is free for the caller, and
-- mint a fencing token, atomically; otherwise, for a waiter, join the queue. (grant.lua and
-- shared_lock.lua are prepended.)
--
-- KEYS[1]  holders  ZSET owner id -> token of every permit granted and not released (shared_lock.lua)
-- KEYS[2]  fence    the semaphore's fence counter (see mint in grant.lua)
-- KEYS[3]  queue    LIST of waiting owner ids, oldest first (see grant.lua)
-- KEYS[4]  entries  HASH owner id -> "<expiry ms> <lease ms>"
-- KEYS[5]  limit    the count of permits in force: set by the first call, kept while a permit
--                   is held or a waiter queued; no expiry (the last release deletes it)
-- KEYS[6]  permit   the caller's permit key: "<namespace>:permit:{<tag>}:" .. ARGV[1]
-- ARGV[1]  owner id, fresh for every acquire call: "<client id>:<sequence>"
-- ARGV[2]  lease in milliseconds
-- ARGV[3]  '0': a single try, never queued; '1': a waiter's first attempt: join the queue if
--          refused; '2': a waiter that may stand in the queue: join or refresh its entry if
--          refused, take it out if granted
-- ARGV[4]  idle: ms the fence counter outlives the clock's passing it
-- ARGV[5]  the caller's count of permits, in decimal
--
-- Returns  {1, token}  granted: the permit key holds ARGV[1] with the lease, ARGV[1] is among the
--                      holders, scored by the token (a decimal string). If the permit is ours
--                      already (a retry after a lost reply, or a release handed it to us), its
--                      lease is re-armed (never shortened) and its token returned.
--          {0, pttl}   no permit for the caller: every permit is held, or the free ones are owed
--                      to live waiters queued before it. pttl: ms until the soonest holder's
--                      lease runs out (-1: none has an expiry), or HANDOFF_LEASE when permits
--                      are free but owed; a waiter asks again by itself then.
--          {-1, limit} the semaphore is in use with another count (a permit held or a waiter
--                      queued): limit is that count; nothing was granted or queued.
--
-- A free permit goes to the caller only if fewer live waiters stand before it than permits are
-- free: first come, first served across clients, even for permits freed by a lease that ran out
-- (which no release hands over).
local holders, fence, queue, entries, limit, permit = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local owner, lease, mode, idle, count = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local prefix = string.sub(permit, 1, #permit - #owner)

local already = held_already(permit, holders, owner, lease)
if already then
  return {1, already}
end

-- The members, dead ones included, bound the live holders from above: while they are fewer than
-- the count, a permit is free without looking at each. Only a refusal, or a count to check,
-- counts them one by one (and takes out the dead).
local held, soonest, exact = redis.call('ZCARD', holders), -1, false
local function count_exactly()
  if not exact then
    held, soonest = live_holders(holders, prefix)
    exact = true
  end
end
local stored = redis.call('GET', limit)
if stored ~= count then
  if stored then
    count_exactly()
    if held > 0 or waiting_before(queue, entries, nil, 1) > 0 then
      return {-1, stored}
    end
  end
  redis.call('SET', limit, count)
end

local free = tonumber(count) - held
if free <= 0 or waiting_before(queue, entries, owner, free) >= free then
  count_exactly()
  free = tonumber(count) - held
end
if free > 0 and waiting_before(queue, entries, owner, free) < free then
  local token = mint(fence, idle)
  -- The holder before its permit key: should the SET fail, a member without a key counts for
  -- nothing, where a key without a member would be a permit nobody counts.
  redis.call('ZADD', holders, token, owner)
  redis.call('SET', permit, owner, 'PX', lease)
  if mode == '2' then
    dequeue(queue, entries, owner)
  end
  return {1, token}
end
if free > 0 then
  -- Free, but owed to waiters before us: they take them, or their entries run out.
  soonest = HANDOFF_LEASE
end
if mode ~= '0' then
  enqueue(queue, entries, owner, lease, math.max(soonest, 0))
end
return {0, soonest}
