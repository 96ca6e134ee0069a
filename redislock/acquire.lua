-- acquire: grant KEYS[1] to a token, or report who holds it.
-- KEYS[1] lock hash   KEYS[2] fence counter
-- ARGV[1] token   ARGV[2] owner   ARGV[3] ttl in ms   ARGV[4] "1" when reentrant
-- Returns {1, fence, holds} when granted, {0, holder owner, holder pttl} when not.
local holds = redis.call('HGET', KEYS[1], ARGV[1])
if holds then
  if ARGV[4] == '1' then
    holds = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
    if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[3]) then
      redis.call('PEXPIRE', KEYS[1], ARGV[3]) -- extend, never shorten
    end
    return {1, redis.call('HGET', KEYS[1], 'fence'), holds}
  end
  return {0, redis.call('HGET', KEYS[1], 'owner') or '', redis.call('PTTL', KEYS[1])}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0, redis.call('HGET', KEYS[1], 'owner') or '', redis.call('PTTL', KEYS[1])}
end
local fence = redis.call('INCR', KEYS[2])
local t = redis.call('TIME')
local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], ARGV[1], 1, 'owner', ARGV[2], 'fence', fence, 'at', at)
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return {1, fence, 1}
