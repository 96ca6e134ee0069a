-- renew: extend KEYS[1] if the token still holds it; never shorten it.
-- KEYS[1] lock hash   ARGV[1] token   ARGV[2] ttl in ms
-- Returns 1 when renewed, 0 when the token is not the holder (or its lease
-- expired and the lock sits in its lock-delay; see acquire.lua).
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 0
end
local ttl = tonumber(ARGV[2])
local delay = 0
local exp = redis.call('HGET', KEYS[1], 'exp')
if exp then
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if now >= tonumber(exp) then
    return 0
  end
  delay = tonumber(redis.call('HGET', KEYS[1], 'delay') or '0')
  if now + ttl > tonumber(exp) then
    redis.call('HSET', KEYS[1], 'exp', now + ttl)
  end
end
if redis.call('PTTL', KEYS[1]) < ttl + delay then
  redis.call('PEXPIRE', KEYS[1], ttl + delay)
end
return 1
