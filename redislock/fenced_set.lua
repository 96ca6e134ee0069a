-- fenced_set: store a value unless a newer fence has already written it.
-- KEYS[1] resource hash (fields value, fence)
-- ARGV[1] fence as a decimal without leading zeros   ARGV[2] value
-- Returns {1} when stored, {0, accepted fence} when the fence is stale.
-- Fences are compared as decimal strings (length, then bytes) so that every
-- uint64 compares exactly; Lua numbers are doubles and lose precision past 2^53.
local function older(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end
local accepted = redis.call('HGET', KEYS[1], 'fence')
if accepted and older(ARGV[1], accepted) then
  return {0, accepted}
end
redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
return {1}
