-- quorum_force.lua: delete one master's part of a quorum lock whoever holds it (force_unlock), and
-- tell the clients waiting for the key.
--
-- KEYS[1]  lock key
-- ARGV[1]  channel  `<namespace>:freed:{<tag>}`, which waiting clients subscribe to by pattern
--
-- Returns  1  the key was there: deleted (the fence stays), and the channel told (with an empty
--             owner id: a forced release is nobody's)
--          0  no key; nothing was changed
if redis.call('DEL', KEYS[1]) == 1 then
  redis.pcall('PUBLISH', ARGV[1], '')
  return 1
end
return 0
