-- confirm.lua: the write-back of a quorum grant. Raise the fence counter to the grant's token T,
-- the largest token of the majority that granted, while the lock is still ours, and re-arm the
-- lease. (grant.lua is prepended: below, raise, rearm.)
--
-- KEYS[1]  lock key   string: the owner id of the current grant, with a PX lease
-- KEYS[2]  fence key  integer counter of grants for this key (see mint in grant.lua)
-- ARGV[1]  owner id   of the attempt being confirmed
-- ARGV[2]  T          the grant's token, decimal digits
-- ARGV[3]  lease      in milliseconds
-- ARGV[4]  idle       ms the fence counter outlives the clock's passing it
--
-- Returns  1  ours: the fence is at least T, and the lease runs at least ARGV[3] ms
--          0  the lock key is gone or another owner's; nothing was changed
--
-- Why only while ours: a confirm that runs late, after our lease ran out and another client was
-- granted here, must not raise the fence under that client's feet; and a grant counted without
-- this master must not count it among its majority.
--
-- The counter's expiry is anchored at its new value (raise, in grant.lua).
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
local t = ARGV[2]
local current = redis.call('GET', KEYS[2])
if current == false or below(current, t) then
  raise(KEYS[2], t, ARGV[4])
end
rearm(KEYS[1], ARGV[3])
return 1
