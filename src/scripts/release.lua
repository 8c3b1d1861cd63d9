-- release.lua: give up a lock we still own, handing it straight to the next waiter if there is
-- one (compare, then delete or re-grant). Also how a waiter that gives up leaves the queue.
-- (grant.lua is prepended: grant, enqueue, dequeue.)
--
-- KEYS[1]  lock key
-- KEYS[2]  fence key
-- KEYS[3]  queue      LIST of waiting owner ids
-- KEYS[4]  entries    HASH owner id -> "<expiry ms> <lease ms>"
-- ARGV[1]  owner id of the grant being released
-- ARGV[2]  '1': ARGV[1] is a waiter giving up: leave the queue first, then release the lock if
--          a handoff reached us meanwhile; '0': a holder's release
-- ARGV[3]  release channel of the namespace
-- ARGV[4]  the escaped user key (the tag)
-- ARGV[5]  prefix of the caller's owner ids: handoffs to these are not published, the caller
--          delivers them itself
-- ARGV[6]  owner id of the caller's own next waiter for this key, or ''
-- ARGV[7]  its lease in ms (when ARGV[6] is set)
-- ARGV[8]  '1': grant ARGV[6] even if the queue has waiters (the caller bounds how often in a
--          row it asks so); '0': the queue comes first
--
-- Returns  {0}                         the key is gone or belongs to another owner; nothing changed
--          {1}                         deleted; nobody waits
--          {2, token, owner, lease}    handed to `owner`: ARGV[6] if ARGV[8] says so, else the
--                                      oldest live entry of the queue, else ARGV[6]. The new grant has its fencing token and the
--                                      owner's lease; unless the owner has the prefix ARGV[5],
--                                      "<token> <owner> <tag>" is published. When the queue's
--                                      waiter is served, ARGV[6] joins the back of the queue.
if ARGV[2] == '1' then
  dequeue(KEYS[3], KEYS[4], ARGV[1])
end
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return {0}
end
if ARGV[6] ~= '' and ARGV[8] == '1' then
  -- It may stand in the queue too: a grant takes it out, or a later release would hand the lock
  -- to a waiter that is done.
  dequeue(KEYS[3], KEYS[4], ARGV[6])
  return {2, grant(KEYS[1], KEYS[2], ARGV[6], ARGV[7]), ARGV[6], tonumber(ARGV[7])}
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
  if expiry and next ~= ARGV[1] then
    now = now or now_ms()
    if tonumber(expiry) > now then
      local token = grant(KEYS[1], KEYS[2], next, lease)
      if ARGV[6] ~= '' and ARGV[6] ~= next then
        enqueue(KEYS[3], KEYS[4], ARGV[6], ARGV[7], tonumber(lease))
      end
      if string.sub(next, 1, #ARGV[5]) ~= ARGV[5] then
        redis.call('PUBLISH', ARGV[3], string.format('%.0f %s %s', token, next, ARGV[4]))
      end
      return {2, token, next, tonumber(lease)}
    end
  end
end
if ARGV[6] ~= '' then
  return {2, grant(KEYS[1], KEYS[2], ARGV[6], ARGV[7]), ARGV[6], tonumber(ARGV[7])}
end
redis.call('DEL', KEYS[1])
return {1}
