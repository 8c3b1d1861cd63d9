-- election_proclaim.lua: a leader says who it is, or changes what it advertises, while it still
-- holds the election's lock; observers hear it at once.
--
-- KEYS[1]  lock key    of the election: the owner id of the current leadership's grant
-- KEYS[2]  record key  HASH of the last proclamation: owner, epoch, seq, value
-- ARGV[1]  owner id    of the leadership proclaiming
-- ARGV[2]  epoch       its fencing token (decimal digits)
-- ARGV[3]  seq         1 for a leadership's first proclamation, rising with each after it
-- ARGV[4]  value       what the leader advertises (any bytes)
-- ARGV[5]  channel     where observers listen: "<namespace>:leader:{<tag>}"
--
-- Returns  1  proclaimed: the record names this leadership, and "leader <epoch> <seq> <pttl>
--             <value>" was published (pttl: the lock's remaining lease in ms, so an observer
--             knows when to look again if the leader dies without a word)
--             A proclamation of ours with this seq or a later one recorded already (this one
--             was sent again) stands as it is, unpublished again.
--          0  the lock is not ours (lost); nothing changed
--
-- A record is only ever read beside the lock key: a record whose owner does not hold the lock
-- names nobody (a leader that crashed leaves its record to the next leader's overwrite).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local recorded = redis.call('HMGET', KEYS[2], 'owner', 'seq')
if recorded[1] == ARGV[1] and tonumber(recorded[2] or 0) >= tonumber(ARGV[3]) then
  return 1
end
redis.call('HSET', KEYS[2], 'owner', ARGV[1], 'epoch', ARGV[2], 'seq', ARGV[3], 'value', ARGV[4])
local pttl = redis.call('PTTL', KEYS[1])
-- Concatenated, not string.format('%s'): that stops at a NUL, which a value may hold. The
-- record is written: a publish refused (an ACL without the channel) must not fail the proclaim;
-- observers then learn of it when they next read.
redis.pcall('PUBLISH', ARGV[5], 'leader ' .. ARGV[2] .. ' ' .. ARGV[3] .. ' ' .. pttl .. ' ' .. ARGV[4])
return 1
