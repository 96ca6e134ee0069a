-- fenced_claim: read a value written by fenced_set, and raise the accepted
-- fence to the reader's, unless a newer fence has claimed or written it.
-- KEYS[1] resource hash (fields value, fence)
-- ARGV[1] fence as a decimal without leading zeros
-- Returns {1, value} (value false when none is stored), or {0, accepted
-- fence} when the fence is stale. Fences compare as in fenced_set.
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
if accepted ~= ARGV[1] then
  redis.call('HSET', KEYS[1], 'fence', ARGV[1])
end
return {1, redis.call('HGET', KEYS[1], 'value')}
