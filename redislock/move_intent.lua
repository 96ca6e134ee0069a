-- move_intent: give token ARGV[2] a writer intent in place of token
-- ARGV[1]'s (driver.IntentMover): when ARGV[1]'s intent is live, or
-- ARGV[1] holds the lock exclusively, its lease live, and no intent is;
-- ARGV[2]'s own live intent is kept. Not for a token that the late-request
-- record holds (released by a clean-up, or withdrawn: see late.lua).
-- KEYS[1] lock hash   KEYS[2] writer intent   KEYS[3] late-request record
-- ARGV[1] from   ARGV[2] to   ARGV[3] owner   ARGV[4] intent ttl in ms
-- Returns 1 when ARGV[2] has the intent after the script, else 0. Nobody
-- is woken: nothing that kept others out went.
local L, W, X = KEYS[1], KEYS[2], KEYS[3]
local from, to = ARGV[1], ARGV[2]
local writer = redis.call('HGET', W, 't')
if writer ~= from and writer ~= to then
  if writer or redis.call('HEXISTS', L, from) == 0 then
    return 0
  end
  local delay = tonumber(redis.call('HGET', L, 'delay') or '0') or 0
  if delay > 0 and redis.call('PTTL', L) <= delay then
    return 0 -- the lease expired: the lock sits in its lock-delay
  end
end
if redis.call('EXISTS', X) == 1 then
  local t = redis.call('TIME')
  local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local till = math.max(tonumber(redis.call('ZSCORE', X, 't' .. to)) or 0,
    tonumber(redis.call('ZSCORE', X, 'w' .. to)) or 0)
  if till > ms then
    return 0
  end
end
redis.call('HSET', W, 't', to, 'o', ARGV[3])
redis.call('PEXPIRE', W, ARGV[4])
return 1
