-- raise_fence (after common.lua): give the grant a token holds, exclusive
-- or shared, the fence ARGV[2], and raise the fence counter to at least
-- ARGV[2] so that later grants draw larger ones. Redlock uses it to give
-- one grant the same fence on all its nodes.
-- KEYS[1] lock hash   KEYS[2] fence counter   KEYS[3] shared holds
-- KEYS[4] shared holds' details   ARGV[1] token   ARGV[2] fence
-- Returns 1 when done, 0 when the token holds nothing (or its lease
-- expired).
local function raise()
  if tonumber(redis.call('GET', KEYS[2]) or '0') < tonumber(ARGV[2]) then
    redis.call('SET', KEYS[2], ARGV[2])
  end
end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  local exp = tonumber(redis.call('ZSCORE', KEYS[3], ARGV[1]))
  if not exp or exp <= now() then
    return 0
  end
  local _, limit, owner = holdDetails(redis.call('HGET', KEYS[4], ARGV[1]))
  redis.call('HSET', KEYS[4], ARGV[1], ARGV[2] .. ' ' .. limit .. ' ' .. owner)
  raise()
  return 1
end
local _, expired = leaseState(KEYS[1])
if expired then
  return 0
end
raise()
redis.call('HSET', KEYS[1], 'fence', ARGV[2])
return 1
