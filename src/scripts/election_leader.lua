-- election_leader.lua: who leads an election, read in one atomic step; writes nothing.
--
-- KEYS[1]  lock key    of the election: the owner id of the current grant, with a PX lease
-- KEYS[2]  record key  HASH of the last proclamation: owner, epoch, seq, value
--
-- Returns  {owner, epoch, seq, value, pttl}
--                                     the lock is held by the owner the record names: that
--                                     leadership's owner id and epoch (decimal digits), the seq
--                                     of its last proclamation, its value, and the lock's PTTL
--                                     in ms (-1: no expiry)
--          {}                         nobody leads: the lock is free, or held by a candidate
--                                     that has not proclaimed yet (it was granted a moment
--                                     ago, or died before it could)
local holder = redis.call('GET', KEYS[1])
if holder == false then
  return {}
end
local recorded = redis.call('HMGET', KEYS[2], 'owner', 'epoch', 'seq', 'value')
if recorded[1] ~= holder then
  return {}
end
return {holder, recorded[2], recorded[3], recorded[4], redis.call('PTTL', KEYS[1])}
