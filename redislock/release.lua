-- release: drop one hold of a token; the last hold deletes the lock and
-- wakes waiters. The fence counter is left alone on purpose.
-- KEYS[1] lock hash   ARGV[1] token   ARGV[2] release channel
-- ARGV[3] the publish command: PUBLISH, or SPUBLISH on a Cluster; "" for
-- a release that wakes nobody (ReleaseQuietly)
-- Returns -1 when the token is not the holder, else the holds left.
local holds = redis.call('HGET', KEYS[1], ARGV[1])
if not holds then
  return -1
end
local exp = redis.call('HGET', KEYS[1], 'exp')
if exp then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) >= tonumber(exp) then
    -- The lease expired and the lock sits in its lock-delay: the late
    -- holder is done with it, so the delay has no more reason to run.
    redis.call('DEL', KEYS[1])
    if ARGV[3] ~= '' then
      redis.call(ARGV[3], ARGV[2], KEYS[1])
    end
    return -1
  end
end
holds = tonumber(holds) - 1
if holds > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], holds)
  return holds
end
redis.call('DEL', KEYS[1])
if ARGV[3] ~= '' then
  redis.call(ARGV[3], ARGV[2], KEYS[1])
end
return 0
