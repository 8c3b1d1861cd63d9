-- shared_lock_status.lua: how a shared lock (a semaphore or a read-write lock) stands, read in
-- one atomic step; writes nothing.
--
-- KEYS[1]  holders  ZSET of the owner ids granted (a permit, or a read; see shared_lock.lua): a
--                   member counts while its key, ARGV[1] .. <owner id>, exists
-- KEYS[2]  entries  HASH owner id -> "<expiry ms> <lease ms>[ <r|w>]" of the waiters in the queue
-- KEYS[3]  own      a semaphore's count in force (a string), or a read-write lock's writers (a
--                   ZSET, counted as KEYS[1] is)
-- ARGV[1]  what a grant's key is before its owner id: "<namespace>:<permit|rwhold>:{<tag>}:"
-- ARGV[2]  'count' if KEYS[3] is a count, 'holders' if it is a ZSET of holders
--
-- Returns  {held, waiters, own}
--          held     live members of KEYS[1]
--          waiters  queue entries not past their expiry: one per waiting client
--          own      the count in force as stored ('' if none: nobody holds or waits), or the
--                   live members of KEYS[3]
local prefix = ARGV[1]

-- A member whose key is gone counts no more (its lease ran out); the scripts that write take it
-- out, this one only reads.
local function live(holders)
  local n = 0
  for _, member in ipairs(redis.call('ZRANGE', holders, 0, -1)) do
    n = n + redis.call('EXISTS', prefix .. member)
  end
  return n
end

local waiters = 0
local entries = redis.call('HVALS', KEYS[2])
if #entries > 0 then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  for _, entry in ipairs(entries) do
    local expiry = tonumber(string.match(entry, '^(%d+) '))
    if expiry and expiry > now_ms then
      waiters = waiters + 1
    end
  end
end
local own
if ARGV[2] == 'holders' then
  own = live(KEYS[3])
else
  own = redis.call('GET', KEYS[3]) or ''
end
return {live(KEYS[1]), waiters, own}
