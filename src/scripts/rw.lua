-- rw.lua: what a read-write lock's acquire and release share, prepended to both after grant.lua
-- and shared_lock.lua (not a script of its own).
--
-- A read-write lock's holders: KEYS[1] is a ZSET of the owner ids granted to read and not
-- released, KEYS[5] the same for writing, each scored by its fencing token. Each grant has its
-- own key, "<namespace>:rwhold:{<tag>}:<owner id>" (KEYS[6] for the caller; the others are in the
-- same slot, named by their owner id behind the same prefix), holding the owner id with the lease
-- as TTL; renewal extends it as it extends a lock key (extend.lua). A member whose key is gone
-- (its lease ran out) counts no more, and is taken out when a script looks (live_holders in
-- shared_lock.lua).
--
-- The queue is a lock's (grant.lua), but each entry in KEYS[4] reads "<expiry ms> <lease ms>
-- <r|w>": whether the waiter wants to read or to write. Policy, first come, first served in one
-- queue: a reader holds beside other readers unless a writer holds or a live writer waits before
-- it; a writer holds alone, and only once nobody holds and no live waiter stands before it.

-- Whether a live writer waits in the queue before `owner` (anywhere in it, if `owner` stands
-- nowhere).
local function writer_before(queue, entries, owner)
  local now
  for _, member in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    if member == owner then
      return false
    end
    local entry = redis.call('HGET', entries, member)
    local expiry = entry and tonumber(string.match(entry, '^(%d+) %d+ w$'))
    if expiry then
      now = now or now_ms()
      if expiry > now then
        return true
      end
    end
  end
  return false
end

-- Live holders of a ZSET of holders; 0 without a call per member when it is empty.
local function live(holders, prefix)
  if redis.call('EXISTS', holders) == 0 then
    return 0, -1
  end
  return live_holders(holders, prefix)
end

-- Grants the lock to the waiters at the head of the queue that may hold now: every live reader
-- up to the first live writer, or that writer alone if nobody holds. Entries of dead waiters
-- (past their expiry) and of `caller` at the head are taken out on the way. Each grant sets
-- the waiter's key for its own lease, at most HANDOFF_LEASE until it confirms, mints its token,
-- and is told to its client (tell in grant.lua) unless that client is the caller's. Returns the
-- grants as a flat list: token, owner, lease, token, owner, lease, ...
local function admit(readers, writers, fence, queue, entries, prefix, idle, caller)
  local granted = {}
  if redis.call('EXISTS', queue) == 0 then
    return granted
  end
  if live(writers, prefix) > 0 then
    return granted
  end
  local now = now_ms()
  while true do
    local next = redis.call('LINDEX', queue, 0)
    if not next then
      break
    end
    local entry = redis.call('HGET', entries, next)
    local expiry, lease, access = string.match(entry or '', '^(%d+) (%d+) ([rw])$')
    if expiry and next ~= caller and tonumber(expiry) > now then
      if access == 'w' and live(readers, prefix) > 0 then
        break
      end
      redis.call('LPOP', queue)
      redis.call('HDEL', entries, next)
      -- The waiter may have died while queued: it has HANDOFF_LEASE to confirm the grant.
      lease = math.min(tonumber(lease), HANDOFF_LEASE)
      local token = mint(fence, idle)
      redis.call('ZADD', access == 'w' and writers or readers, token, next)
      redis.call('SET', prefix .. next, next, 'PX', lease)
      tell(readers, caller, next, token)
      granted[#granted + 1] = token
      granted[#granted + 1] = next
      granted[#granted + 1] = lease
      if access == 'w' then
        break
      end
    else
      redis.call('LPOP', queue)
      redis.call('HDEL', entries, next)
    end
  end
  return granted
end
