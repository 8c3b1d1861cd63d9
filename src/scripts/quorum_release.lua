-- quorum_release.lua: release one master's part of a quorum grant (compare-and-delete), and tell
-- the clients waiting for the key. A quorum has no queue in Redis and no handoff: waiters learn
-- of the release from this message and attempt again.
--
-- KEYS[1]  lock key
-- KEYS[2]  released (optional) ZSET: the owner ids of releases here that found the lock key gone
--                   or another's, each scored with when it may be forgotten (server time, ms);
--                   acquire.lua refuses these owners
-- ARGV[1]  owner id of our grant, or of a failed attempt
-- ARGV[2]  channel  `<namespace>:freed:{<tag>}`, which waiting clients subscribe to by pattern;
--                   empty for a failed attempt, whose release changes nothing for anyone waiting
-- ARGV[3]  with KEYS[2]: how long, in ms, to remember the owner id there
--
-- Returns  1  ours: deleted (the fence stays), and the channel told the released owner id (a
--             waiter hears one release from every master, and acts on the first)
--          0  the key is gone or another owner's; the lock key is unchanged, and the owner id is
--             remembered in KEYS[2] (entries past their time are dropped then)
--
-- Why remember: a release can run before the acquire it undoes. A lock call's requests to one
-- master go in order on one connection, but the holder's unlock is a call of its own, on another
-- connection, and the grant may have been decided without this master's reply (a majority
-- answered first). That acquire, run after the release, would leave a key nobody releases for a
-- whole lease, and with a minority of masters down every attempt needs this master: the lock
-- would be stuck for that long. Remembered here, the late acquire is refused instead.
--
-- The message is best effort: an ACL user without the channel pattern (`&<namespace>:freed:*`)
-- still releases, and its waiters attempt again when the holder's lease would have run out.
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  if ARGV[2] ~= '' then
    redis.pcall('PUBLISH', ARGV[2], ARGV[1])
  end
  return 1
end
if KEYS[2] then
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now_ms)
  redis.call('ZADD', KEYS[2], now_ms + tonumber(ARGV[3]), ARGV[1])
  redis.call('PEXPIRE', KEYS[2], ARGV[3])
end
return 0
