-- acquire: grant KEYS[1] to a token, or report who holds it.
-- KEYS[1] lock hash   KEYS[2] fence counter
-- ARGV[1] token   ARGV[2] owner   ARGV[3] ttl in ms   ARGV[4] "1" when reentrant
-- ARGV[5] lock-delay in ms ("0": none)
-- Returns {1, fence, holds} when granted, {0, holder owner, holder pttl} when not.
--
-- With a lock-delay the hash also keeps 'exp' (when the lease expires, ms by
-- the server's clock) and 'delay', and lives delay ms past 'exp': in between,
-- the lock is expired but nobody may take it.
local function now()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function busy()
  return {0, redis.call('HGET', KEYS[1], 'owner') or '', redis.call('PTTL', KEYS[1])}
end
local ttl = tonumber(ARGV[3])
local exp = redis.call('HGET', KEYS[1], 'exp')
if exp and now() >= tonumber(exp) then
  return busy() -- expired, kept out of reach for its lock-delay
end
local holds = redis.call('HGET', KEYS[1], ARGV[1])
if holds then
  if ARGV[4] ~= '1' then
    return busy()
  end
  holds = redis.call('HINCRBY', KEYS[1], ARGV[1], 1)
  local delay = tonumber(redis.call('HGET', KEYS[1], 'delay') or '0')
  if delay > 0 then
    local e = now() + ttl
    if e > tonumber(exp) then
      redis.call('HSET', KEYS[1], 'exp', e)
    end
  end
  if redis.call('PTTL', KEYS[1]) < ttl + delay then
    redis.call('PEXPIRE', KEYS[1], ttl + delay) -- extend, never shorten
  end
  return {1, redis.call('HGET', KEYS[1], 'fence'), holds}
end
if redis.call('EXISTS', KEYS[1]) == 1 then
  return busy()
end
local fence = redis.call('INCR', KEYS[2])
local at = now()
local delay = tonumber(ARGV[5]) or 0
redis.call('HSET', KEYS[1], ARGV[1], 1, 'owner', ARGV[2], 'fence', fence, 'at', at)
if delay > 0 then
  redis.call('HSET', KEYS[1], 'exp', at + ttl, 'delay', delay)
end
redis.call('PEXPIRE', KEYS[1], ttl + delay)
return {1, fence, 1}
