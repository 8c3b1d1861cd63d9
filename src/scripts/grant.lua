-- grant.lua: functions shared by every script that grants (a lock's acquire.lua, confirm.lua and
-- release.lua, a shared lock's permit_*.lua and rw_*.lua), prepended to each (not a script of
-- its own).
--
-- The queue of a key: KEYS[3] is a LIST of the owner ids waiting, oldest first; KEYS[4] a HASH
-- from each of those owner ids to "<expiry ms> <lease ms>" (a read-write lock's add " r" or
-- " w"). An entry past its expiry (server clock) belongs to a waiter that stopped asking and is
-- skipped; both keys expire with their longest-lived entry.

local function now_ms()
  local now = redis.call('TIME')
  return tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
end

-- How long a release grants the lock to a waiter of its queue: the waiter's own lease, but no more
-- than this (ms) until the waiter confirms it by extending. A waiter that died while queued then
-- holds up everyone behind it for at most this long, whatever lease it asked for. The client
-- side has the same number (HANDOFF_LEASE in scripts/mod.rs).
local HANDOFF_LEASE = 5000

-- When the fence counter holding `token` may expire, as an absolute server time in ms (for
-- PEXPIREAT or SET PXAT): `idle` ms after the server clock passes the token, read as
-- microseconds. Until then a token minted from the clock could be at or below the counter, so the
-- counter must stay; after, the clock floor alone mints tokens above it. `token` is a double
-- below 2^53, so it is exact; math.floor(token / 1000) rounds to nearest and then down, which can
-- land one ms above the true quotient's floor but never below it, so the result times 1000 always
-- exceeds the token by at least idle * 1000 microseconds.
local function lapse_at(token, idle)
  return string.format('%.0f', math.floor(token / 1000) + 1 + tonumber(idle))
end

-- Raises the fence counter, returns the new token as a decimal string, and sets when the counter
-- expires if no grant follows (lapse_at). The token is the counter after INCR, lifted to the
-- server clock in microseconds (TIME) when the counter is behind it.
--
-- Lua numbers are doubles, exact only up to 2^53, and INCR's reply arrives as one: a counter set
-- by hand or restored from elsewhere can be beyond, and then only GET gives its digits. Below
-- 2^53 the reply is exact, and formatting it costs no call. (The clock, about 1.8e15 today, is
-- far below 2^53, so comparing with it is exact whatever the counter.)
--
-- The clock floor keeps tokens increasing where a plain counter goes back: after a restart
-- without persistence (the counter starts again at 0) and after a failover that lost the last
-- increments. It assumes the server clock never steps back by more than the time such an event
-- takes. Redis replicates script effects, so TIME before writes is allowed and replicas receive
-- the resulting SET, not the clock reading.
--
-- The same floor lets the counter expire once the key is idle: the counter lives until `idle` ms
-- after the clock passes it, so the first grant after it expired takes a token from a clock that
-- is past every earlier token, unless the clock stepped back by more than `idle` meanwhile. The
-- expiry is anchored at the counter, not at now: a counter that ran ahead of the clock (grants
-- faster than one a microsecond, a value set by hand, a clock that stepped back) stays until the
-- clock has caught up with it. INCR keeps a TTL and SET clears one, so every branch sets its
-- own. A counter at or beyond 2^53 (a clock reading of the year 2255) never expires: its TTL
-- could not be computed exactly, and the clock will not pass it anyway.
local function mint(fence, idle)
  local counter = redis.call('INCR', fence)
  local now = redis.call('TIME')
  local floor = tonumber(now[1]) * 1000000 + tonumber(now[2])
  if counter < floor then
    local token = string.format('%.0f', floor)
    redis.call('SET', fence, token, 'PXAT', lapse_at(floor, idle))
    return token
  end
  if counter < 9007199254740992 then
    redis.call('PEXPIREAT', fence, lapse_at(counter, idle))
    return string.format('%.0f', counter)
  end
  redis.call('PERSIST', fence)
  return redis.call('GET', fence)
end

-- Whether decimal digits `a` are below decimal digits `b` (neither with leading zeros): exact
-- beyond 2^53, where Lua numbers are not.
local function below(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end

-- Sets the fence counter to `token` (decimal digits), with its expiry anchored at the new value
-- as mint anchors it: anchored at the old value, or at now, the counter could expire while the
-- clock is still below the token, and the clock floor would then mint at or below it.
local function raise(fence, token, idle)
  if below(token, '9007199254740992') then
    redis.call('SET', fence, token, 'PXAT', lapse_at(tonumber(token), idle))
  else
    -- At or beyond 2^53 (a clock reading of the year 2255) the expiry cannot be computed
    -- exactly, and the clock will not pass it anyway: the counter never expires, as in mint.
    redis.call('SET', fence, token)
  end
end

-- A quorum grant's token: the client's proposal P (decimal digits) if it is above every token
-- this master ever stored, else one minted here. Returns the token and 1 if it is P, 0 if minted.
--
-- Above every token stored: above the fence counter, which only rises and holds the largest of
-- them; with no counter, at or above the clock floor `floor` (microseconds, decimal digits),
-- which mint would take and which is past every token of a counter that lapsed or was lost in a
-- restart (see mint). Taking P is then what a mint followed by the write-back of P would leave,
-- in one step: a majority that took P holds it as a write-back majority would, so the client
-- needs no write-back round (model/README.md).
local function propose(fence, idle, proposal, floor)
  if proposal ~= nil and string.match(proposal, '^[1-9]%d*$') then
    local current = redis.call('GET', fence)
    if (current and below(current, proposal)) or (not current and not below(proposal, floor)) then
      raise(fence, proposal, idle)
      return proposal, 1
    end
  end
  return mint(fence, idle), 0
end

-- Sets the lock to `owner` for `lease` ms and returns its fencing token (see mint; `idle` is
-- how long the counter outlives the clock's passing it).
--
-- INCR runs before SET: scripts do not roll back, and a fence key that cannot be incremented
-- (a wrong type, an overflow) must fail the script before it leaves a lock behind.
local function grant(lock, fence, owner, lease, idle)
  local token = mint(fence, idle)
  redis.call('SET', lock, owner, 'PX', lease)
  return token
end

-- Re-arms the lease of a lock to `lease` ms from now, unless it already runs longer. An extend
-- never shortens a lease: one delayed in the network (sent before a longer extend, applied
-- after it) then cannot end the lease before the holder's local deadline, which is the latest
-- end any confirmed extend promised.
local function rearm(lock, lease)
  if redis.call('PTTL', lock) < tonumber(lease) then
    redis.call('PEXPIRE', lock, lease)
  end
end

-- Puts `owner` at the back of the queue, or refreshes its entry where it already stands. The
-- entry lives `wait` ms (until the current holder's lease runs out, when the waiter asks again
-- by itself) plus the waiter's own lease. `access` ('r' or 'w', a read-write lock's waiter's)
-- ends the entry if given.
local function enqueue(queue, entries, owner, lease, wait, access)
  local ttl = wait + tonumber(lease)
  local entry = string.format('%.0f %s', now_ms() + ttl, lease)
  if access then
    entry = entry .. ' ' .. access
  end
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

-- Tells the client of waiter `next` that a release granted it `token`, unless that client is
-- the caller's (its owner ids start like `caller`, up to the ':'), which hands the grant over in
-- its own process. `key` is one of the lock's keys, "<namespace>:<kind>:{<tag>}": the namespace
-- holds no '{' and the tag no '{' or '}', so the first '{' opens the tag.
local function tell(key, caller, next, token)
  local mine = string.match(caller, '^[^:]*:') or caller
  if string.sub(next, 1, #mine) == mine then
    return
  end
  local namespace, tag = string.match(key, '^(.*):[^:{}]*:{([^{}]*)}$')
  -- Concatenated, not string.format('%s'): that stops at a NUL, which keys may hold.
  local message = token .. ' ' .. next .. ' ' .. tag
  local client = string.match(next, '^[^:]*')
  -- The grant is made already: a publish refused (an ACL without the channel) must not fail
  -- the release; the waiter finds the grant its own at its next attempt.
  local heard = 0
  if string.sub(client, 1, 1) == 's' and (tonumber(redis.REDIS_VERSION_NUM) or 0) >= 0x070000 then
    -- A client on a cluster listens on a channel of its own in the key's slot: only this shard
    -- hears it, where a PUBLISH would go to every node.
    heard = redis.pcall('SPUBLISH', namespace .. ':released:{' .. tag .. '}:' .. client, message)
  end
  if type(heard) ~= 'number' or heard == 0 then
    -- Nobody heard it here (its subscription not made yet, or made on the node a migrating slot
    -- is leaving): every client also listens on its classic channel.
    redis.pcall('PUBLISH', namespace .. ':released:' .. client, message)
  end
end
