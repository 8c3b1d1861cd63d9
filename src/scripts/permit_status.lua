-- permit_status.lua: how a semaphore stands, read in one atomic step; writes nothing.
--
-- KEYS[1]  holders  ZSET of the owner ids granted a permit (see permits.lua); a member counts
--                   while its permit key, "<namespace>:permit:{<tag>}:<owner id>", exists
-- KEYS[2]  entries  HASH owner id -> "<expiry ms> <lease ms>" of the waiters in the queue
-- KEYS[3]  limit    the count of permits in force, if any
--
-- Returns  {held, waiters, limit}
--          held     live holders
--          waiters  queue entries not past their expiry: one per waiting client
--          limit    the count in force, as stored ('' if none: nobody holds or waits)
local namespace, braced = string.match(KEYS[1], '^(.*):permits:({[^{}]*})$')
local prefix = namespace .. ':permit:' .. braced .. ':'
local held = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  held = held + redis.call('EXISTS', prefix .. member)
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
return {held, waiters, redis.call('GET', KEYS[3]) or ''}
