-- election_leader.lua: who leads an election, read in one atomic step; writes nothing.
--
-- KEYS[1]  lock key    of the election: the owner id of the current grant, with a PX lease
-- KEYS[2]  record key  HASH of the last proclamation: owner, epoch, seq, value
-- KEYS[3]  fence key   of the election: the token of its latest grant
--
-- Returns  {owner, epoch, seq, value, pttl}
--                                     the lock is held by the owner the record names: that
--                                     leadership's owner id and epoch (decimal digits), the seq
--                                     of its last proclamation, its value, and the lock's PTTL
--                                     in ms (-1: no expiry)
--          {held, fence}              nobody leads: the lock is free (held 0), or held by a
--                                     candidate that has not proclaimed yet (held 1: granted a
--                                     moment ago, or dead since); fence is the counter (the
--                                     latest grant's token, '' if gone), so that a reader can
--                                     tell every proclamation of an earlier epoch is over
local holder = redis.call('GET', KEYS[1])
if holder == false then
  return {0, redis.call('GET', KEYS[3]) or ''}
end
local recorded = redis.call('HMGET', KEYS[2], 'owner', 'epoch', 'seq', 'value')
if recorded[1] ~= holder then
  return {1, redis.call('GET', KEYS[3]) or ''}
end
return {holder, recorded[2], recorded[3], recorded[4], redis.call('PTTL', KEYS[1])}
