-- election_resign.lua: a leader about to release the election's lock withdraws its record and
-- tells observers, before the release hands the lock to the next candidate.
--
-- KEYS[1]  record key  HASH of the last proclamation: owner, epoch, seq, value
-- ARGV[1]  owner id    of the leadership resigning
-- ARGV[2]  channel     where observers listen
--
-- Returns  1  the record was ours: deleted, and "resigned <epoch> <seq>" published
--          0  the record names another leadership (or none); nothing changed
local recorded = redis.call('HMGET', KEYS[1], 'owner', 'epoch', 'seq')
if recorded[1] ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
redis.pcall('PUBLISH', ARGV[2], 'resigned ' .. recorded[2] .. ' ' .. recorded[3])
return 1
