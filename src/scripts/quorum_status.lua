-- quorum_status.lua: how one master's part of a quorum lock stands, read in one step.
--
-- KEYS[1]  lock key
-- KEYS[2]  fence key
--
-- Returns  {owner, pttl, fence}
--          owner  the owner id at the lock key, or false (nil) if there is none
--          pttl   its remaining lease in ms (-2 without a key, -1 without an expiry)
--          fence  the fence counter (the last token minted for the key), or false if none was
return {redis.call('GET', KEYS[1]), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[2])}
