-- release.lua: give up a lock we still own, handing it straight to the next waiter if there is
-- one (compare, then delete or re-grant). Also how a waiter that gives up leaves the queue, and
-- how an operator takes a lock from whoever holds it (forced). (grant.lua is prepended: mint,
-- grant, rearm, enqueue, dequeue.)
--
-- KEYS[1]  lock key
-- KEYS[2]  fence key  the counter of grants (see mint in grant.lua)
-- KEYS[3]  queue      LIST of waiting owner ids
-- KEYS[4]  entries    HASH owner id -> "<expiry ms> <lease ms>"
-- ARGV[1]  owner id of the grant being released; when forced, the caller's owner-id prefix
--          ("<client id>:"), which names no grant and only tells the caller's waiters apart
-- ARGV[2]  '1': ARGV[1] is a waiter giving up: leave the queue first, then release the lock if
--          a handoff reached us meanwhile; '0': a holder's release; '2': forced: release the
--          lock whoever holds it (the fence counter is left alone: a handoff mints above it)
-- ARGV[3]  idle: ms the fence counter outlives the clock's passing it, re-armed by a handoff
-- ARGV[4]  owner id of the caller's own next waiter for this key (absent: none)
-- ARGV[5]  its lease in ms
-- ARGV[6]  '1': grant ARGV[4] even if the queue has waiters (the caller bounds how often in a
--          row it asks so); '0': the queue comes first
--
-- Returns  {0}                         the key is gone or belongs to another owner (forced: the
--                                      key is gone); nothing changed
--          {1}                         deleted; nobody waits
--          {2, token, owner, lease}    handed to `owner`: ARGV[4] if ARGV[6] says so, else the
--                                      oldest live entry of the queue, else ARGV[4]. The new
--                                      grant has its fencing token (a decimal string) and the
--                                      lease set: ARGV[5] for ARGV[4], the entry's lease but at
--                                      most HANDOFF_LEASE for a queue's waiter. Unless
--                                      the owner is one of the caller's (its id starts like
--                                      ARGV[1], up to the ':'), "<token> <owner> <tag>" is
--                                      published on "<namespace>:released:<client>", the
--                                      owner's client (its id up to the ':'), namespace and tag
--                                      read off the lock key "<namespace>:lock:{<tag>}"; for a
--                                      client whose id starts with 's' (one on a cluster), on
--                                      Redis 7.0 or later, with SPUBLISH on the shard channel
--                                      "<namespace>:released:{<tag>}:<client>" instead, unless
--                                      no subscriber of this node heard it. When the
--                                      queue's waiter is served, ARGV[4] joins the back of the
--                                      queue.
--
-- What a handoff needs is derived here rather than passed: an unlock with nobody waiting, the
-- common case, sends three arguments.
local idle, next_owner, next_lease = ARGV[3], ARGV[4], ARGV[5]
if ARGV[2] == '1' then
  dequeue(KEYS[3], KEYS[4], ARGV[1])
end
local holder = redis.call('GET', KEYS[1])
if holder == false or (holder ~= ARGV[1] and ARGV[2] ~= '2') then
  return {0}
end
if next_owner and ARGV[6] == '1' then
  -- It may stand in the queue too: a grant takes it out, or a later release would hand the lock
  -- to a waiter that is done.
  dequeue(KEYS[3], KEYS[4], next_owner)
  return {2, grant(KEYS[1], KEYS[2], next_owner, next_lease, idle), next_owner, tonumber(next_lease)}
end
local now
-- Ends with the queue: every entry popped is either granted or gone (a dead waiter's).
while true do
  local next = redis.call('LPOP', KEYS[3])
  if not next then
    break
  end
  local entry = redis.call('HGET', KEYS[4], next)
  if entry then
    redis.call('HDEL', KEYS[4], next)
  end
  local expiry, lease = string.match(entry or '', '^(%d+) (%d+)$')
  if expiry and next ~= holder then
    now = now or now_ms()
    if tonumber(expiry) > now then
      -- The waiter may have died while queued: it has HANDOFF_LEASE to confirm the grant.
      lease = math.min(tonumber(lease), HANDOFF_LEASE)
      local token = grant(KEYS[1], KEYS[2], next, lease, idle)
      if next_owner and next_owner ~= next then
        enqueue(KEYS[3], KEYS[4], next_owner, next_lease, lease)
      end
      tell(KEYS[1], ARGV[1], next, token)
      return {2, token, next, lease}
    end
  end
end
if next_owner then
  return {2, grant(KEYS[1], KEYS[2], next_owner, next_lease, idle), next_owner, tonumber(next_lease)}
end
redis.call('DEL', KEYS[1])
return {1}
