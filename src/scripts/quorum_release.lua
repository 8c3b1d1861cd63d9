-- quorum_release.lua: release one master's part of a quorum grant (compare-and-delete), and tell
-- the clients waiting for the key. A quorum has no queue in Redis and no handoff: waiters learn
-- of the release from this message and attempt again.
--
-- KEYS[1]  lock key
-- ARGV[1]  owner id of our grant, or of a failed attempt
-- ARGV[2]  channel  `<namespace>:freed:{<tag>}`, which waiting clients subscribe to by pattern;
--                   empty for a failed attempt, whose release changes nothing for anyone waiting
--
-- Returns  1  ours: deleted (the fence stays), and the channel told the released owner id (a
--             waiter hears one release from every master, and acts on the first)
--          0  the key is gone or another owner's; nothing was changed
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
return 0
