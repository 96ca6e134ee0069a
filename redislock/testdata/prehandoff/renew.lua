-- renew: extend the token's hold, exclusive or shared, if it still holds
-- it; never shorten it. scripts.go puts common.lua in place of the line
-- "--#common".
-- KEYS[1] lock hash   KEYS[2] shared holds   KEYS[3] shared holds' details
-- ARGV[1] token   ARGV[2] ttl in ms   ARGV[3] the fence of the grant the
-- renewal extends, or "" when the caller does not say
-- Returns 1 when renewed, 0 when the token holds nothing (or its lease
-- expired and the lock sits in its lock-delay; see acquire.lua), or holds
-- an exclusive grant whose fence is not ARGV[3].
local L, S, SI = KEYS[1], KEYS[2], KEYS[3]
local ttl = tonumber(ARGV[2])
--#common
local h = redis.call('HMGET', L, ARGV[1], 'fence', 'delay')
if not h[1] then
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
if ARGV[3] and ARGV[3] ~= '' and h[2] ~= ARGV[3] then
  -- The token holds a later grant (its owner ID was granted the lock again
  -- after this caller's grant ended): not this renewal's to extend.
  return 0
end
-- PEXPIRE is all a renewal writes: Redis allows it at maxmemory.
local delay, expired = leaseState(L, h[3])
if expired then
  return 0
end
if redis.call('PTTL', L) < ttl + delay then
  redis.call('PEXPIRE', L, ttl + delay)
end
return 1
