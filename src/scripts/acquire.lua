-- acquire.lua: grant the lock if it is free and mint a fencing token, atomically; otherwise, for
-- a waiter, join the key's queue. (grant.lua is prepended: mint, grant, rearm, enqueue, dequeue.)
--
-- KEYS[1]  lock key   string: the owner id of the current grant, with a PX lease
-- KEYS[2]  fence key  integer counter of grants for this key; expires ARGV[4] ms after the
--                     server clock (in microseconds) passes it (see mint in grant.lua)
-- KEYS[3]  queue      LIST of waiting owner ids (see grant.lua)
-- KEYS[4]  entries    HASH owner id -> "<expiry ms> <lease ms>"
-- KEYS[5]  released   with ARGV[3] = 'h' only: ZSET of owner ids whose release ran here before
--                     their acquire (see quorum_release.lua); their acquires are refused
-- ARGV[1]  owner id   fresh for every lock call: "<client id>:<sequence>"
-- ARGV[2]  lease      in milliseconds
-- ARGV[3]  '0': a single try, never queued; 'h': the same for a quorum attempt, whose refusal
--          names the holder (to tell a majority holder from attempts that split the masters)
--          and whose grant may take the client's proposal as its token (ARGV[5]);
--          '1': a waiter's first attempt: join the queue if the
--          lock is held; '2': a waiter that may stand in the queue already: join or refresh its
--          entry if the lock is held, take it out if granted
-- ARGV[4]  idle       ms the fence counter outlives the clock's passing it, re-armed by every grant
-- ARGV[5]  proposal   with ARGV[3] = 'h' only: the token the client proposes, decimal digits
--                     (see propose in grant.lua); taken if above every token stored here
--
-- Returns  {1, token}  granted (and out of the queue); the token is a bulk string of decimal
--                      digits (exact beyond 2^53). If the lock already belongs to ARGV[1] (a
--                      retry after a reply was lost, or a release handed it to us) the lease is
--                      re-armed (never shortened) and the current counter is returned: nobody
--                      else can have been granted since.
--          {0, pttl}   held by another owner; pttl is its remaining lease in ms (-1: no expiry).
--          With ARGV[3] = 'h', the replies name more: {1, token, taken, clock} when granted, where
--                      taken is 1 if the token is the proposal and clock the server's TIME in
--                      microseconds (decimal digits), from which the client proposes next time;
--                      {0, pttl, holder, clock} when refused; {0, 0, '', clock} when this owner
--                      was released here already.
--                      A waiter's entry is made or refreshed to outlive its next unprompted
--                      attempt, at the holder's expiry.

-- The server's clock (TIME) in microseconds, as decimal digits: a quorum reply carries it.
local function clock()
  local now = redis.call('TIME')
  return now[1] .. string.format('%06d', tonumber(now[2]))
end

local holder = redis.call('GET', KEYS[1])
if holder == ARGV[1] then
  rearm(KEYS[1], ARGV[2])
  -- Nobody else was granted since our grant minted the counter's value. If the counter is gone
  -- (expired while we held the lock for longer than its idle period, deleted, evicted), a new
  -- token is minted under the clock floor, as for any grant.
  local token = redis.call('GET', KEYS[2])
  if token == false then
    token = mint(KEYS[2], ARGV[4])
  end
  if ARGV[3] == 'h' then
    -- A quorum request that ran twice. The counter only rose since our grant set it, so if it
    -- equals the proposal, it was below the proposal when we were granted: taken, as far as
    -- the client can count it.
    return {1, token, token == ARGV[5] and 1 or 0, clock()}
  end
  return {1, token}
end
if ARGV[3] == 'h' then
  -- A quorum attempt (model/README.md): never queued, and every reply carries the clock.
  local now = clock()
  if holder ~= false then
    return {0, redis.call('PTTL', KEYS[1]), holder, now}
  end
  if KEYS[5] and redis.call('ZSCORE', KEYS[5], ARGV[1]) then
    -- Released before it ran: granting now would leave a key nobody releases.
    return {0, 0, '', now}
  end
  -- propose's first write is the fence's (SET or INCR), before the lock's, as in grant.
  local token, taken = propose(KEYS[2], ARGV[4], ARGV[5], now)
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
  return {1, token, taken, now}
end
if holder == false then
  -- grant first: under maxmemory Redis refuses only a script's first write, and INCR must be it.
  local token = grant(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[4])
  if ARGV[3] == '2' then
    dequeue(KEYS[3], KEYS[4], ARGV[1])
  end
  return {1, token}
end
local pttl = redis.call('PTTL', KEYS[1])
if ARGV[3] ~= '0' then
  enqueue(KEYS[3], KEYS[4], ARGV[1], ARGV[2], math.max(pttl, 0))
end
return {0, pttl}
