-- status.lua: how a lock stands, read in one atomic step; writes nothing.
--
-- KEYS[1]  lock key   string: the owner id of the current grant, with a PX lease
-- KEYS[2]  fence key  the counter of grants: every grant sets it to the grant's token in the
--                     same script that sets the lock key, and nothing else writes it, so while
--                     the lock is held it holds the holder's token
-- KEYS[3]  entries    HASH owner id -> "<expiry ms> <lease ms>" of the waiters in the queue
--
-- Returns  {held, token, pttl, waiters}
--          held     1 if the lock key exists, else 0
--          token    while held, the fence counter as it is stored (a decimal string, exact
--                   beyond 2^53); '' when free, or when the counter is gone (it expired during
--                   a hold longer than the idle expiry, or was deleted)
--          pttl     the lock key's PTTL: its remaining lease in ms, -1 without expiry, -2 free
--          waiters  queue entries not past their expiry: one per waiting client (a client's
--                   other threads wait behind its head, in its own process)
local pttl = redis.call('PTTL', KEYS[1])
local held = 0
local token = ''
if pttl ~= -2 then
  held = 1
  token = redis.call('GET', KEYS[2]) or ''
end
-- An entry past its expiry is a waiter that stopped asking; a release skips it, so it is not
-- counted. The queue holds one entry per waiting client: counting them is cheap.
local waiters = 0
local entries = redis.call('HVALS', KEYS[3])
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
return {held, token, pttl, waiters}
