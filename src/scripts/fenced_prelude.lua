-- fenced_prelude.lua: prepended to every fenced_*.lua write script; the one check they share.
--
-- Tokens travel (ARGV) and are stored (the accepted-token key) as canonical decimal strings, and
-- are compared as strings, shorter first: Lua numbers are doubles, so tokens above 2^53 would
-- round and two different tokens could compare equal.
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
