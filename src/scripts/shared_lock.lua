-- shared_lock.lua: what the acquire and release scripts of a shared lock (a semaphore's
-- permit_*.lua, a read-write lock's rw_*.lua) share, prepended to each after grant.lua (not a
-- script of its own).
--
-- A shared lock's holders: KEYS[1] is a ZSET of the owner ids granted (a permit, or a read) and
-- not released, scored by their fencing tokens (a read-write lock's writers are in a second
-- ZSET, KEYS[5]). Each grant has its own key, "<namespace>:permit:{<tag>}:<owner id>" or
-- "<namespace>:rwhold:{<tag>}:<owner id>" (KEYS[6] for the caller: the others are in the same
-- slot, and are named by their owner id behind the same prefix), holding the owner id with the
-- lease as TTL; renewal extends it as it extends a lock key (extend.lua). A member whose key is
-- gone (its lease ran out: the holder crashed, stalled, or lost it) counts no more, and is taken
-- out when a script looks.

-- The token of `owner`'s grant if it holds one already (a retry after a lost reply, or a grant a
-- release handed it): its key holds `owner` and it is a member of `holders`. Its lease is
-- re-armed then, never shortened. A key that is ours but not a member (taken out by hand) would
-- count for nothing, so it is no grant: it is deleted. Returns the token as a decimal string, or
-- nil.
local function held_already(key, holders, owner, lease)
  if redis.call('GET', key) ~= owner then
    return nil
  end
  local token = redis.call('ZSCORE', holders, owner)
  if not token then
    redis.call('DEL', key)
    return nil
  end
  rearm(key, lease)
  return string.format('%.0f', tonumber(token))
end

-- Counts the live holders, taking out the dead; returns the count and the soonest end of a live
-- holder's lease in ms from now (-1: none is live, or none has an expiry).
local function live_holders(holders, prefix)
  local n, soonest = 0, -1
  for _, member in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
    local pttl = redis.call('PTTL', prefix .. member)
    if pttl == -2 then
      redis.call('ZREM', holders, member)
    else
      n = n + 1
      if pttl >= 0 and (soonest < 0 or pttl < soonest) then
        soonest = pttl
      end
    end
  end
  return n, soonest
end

-- How many live entries of the queue stand before `owner` (before the end, if it stands
-- nowhere), counted up to `upto` at most.
local function waiting_before(queue, entries, owner, upto)
  local n = 0
  if upto <= 0 then
    return 0
  end
  local now
  for _, member in ipairs(redis.call('LRANGE', queue, 0, -1)) do
    if member == owner then
      break
    end
    local entry = redis.call('HGET', entries, member)
    local expiry = entry and tonumber(string.match(entry, '^(%d+) '))
    if expiry then
      now = now or now_ms()
      if expiry > now then
        n = n + 1
        if n >= upto then
          break
        end
      end
    end
  end
  return n
end
