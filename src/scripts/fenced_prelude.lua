-- fenced_prelude.lua: prepended to every fenced_*.lua write script; the one check they share.
--
-- Tokens travel (ARGV) and are stored (the accepted-token key) as canonical decimal strings, and
-- are compared as strings, shorter first: Lua numbers are doubles, so tokens above 2^53 would
-- round and two different tokens could compare equal.
--
-- Every write script that goes ahead SETs the accepted-token key, even to the token it holds
-- already: with replica acknowledgement a WAIT follows the script on its connection, and from
-- Redis 7.2 a WAIT counts only what its own connection wrote (on a connection that wrote nothing,
-- every connected replica counts, lagging or not). That SET makes it count this write and all
-- before it.
--
-- refuse_stale(accepted_key, token)
--   nil            nothing accepted yet, or token >= the accepted token: the write may go ahead
--   {0, highest}   token is lower than the accepted token; the script returns this as its reply
--   error reply    the accepted-token key holds something that is not a token; nothing changes
local function refuse_stale(accepted_key, token)
  local highest = redis.call('GET', accepted_key)
  if highest == false then
    return nil
  end
  if not (highest == '0' or string.find(highest, '^[1-9]%d*$')) then
    return redis.error_reply('ERR fencelock: ' .. accepted_key .. ' holds no fencing token')
  end
  if #token < #highest or (#token == #highest and token < highest) then
    return {0, highest}
  end
  return nil
end
