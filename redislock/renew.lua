-- renew: extend the token's hold, exclusive or shared, if it still holds
-- it; never shorten it. scripts.go puts common.lua in place of the line
-- "--#common".
-- KEYS[1] lock hash   KEYS[2] shared holds   KEYS[3] shared holds' details
-- ARGV[1] token   ARGV[2] ttl in ms
-- Returns 1 when renewed, 0 when the token holds nothing (or its lease
-- expired and the lock sits in its lock-delay; see acquire.lua).
local L, S, SI = KEYS[1], KEYS[2], KEYS[3]
local ttl = tonumber(ARGV[2])
--#common
if redis.call('HEXISTS', L, ARGV[1]) == 0 then
  local exp = tonumber(redis.call('ZSCORE', S, ARGV[1]))
  if not exp or exp <= now() then
    return 0
  end
  if now() + ttl > exp then
    redis.call('ZADD', S, now() + ttl, ARGV[1])
    fit(S, SI)
  end
  return 1
end
-- PEXPIRE is all a renewal writes: Redis allows it at maxmemory.
local delay, expired = leaseState(L)
if expired then
  return 0
end
if redis.call('PTTL', L) < ttl + delay then
  redis.call('PEXPIRE', L, ttl + delay)
end
return 1
