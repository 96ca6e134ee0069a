-- release: drop one hold of a token; the last hold deletes the lock and
-- wakes waiters. The fence counter is left alone on purpose.
-- KEYS[1] lock hash   ARGV[1] token   ARGV[2] release channel
-- Returns -1 when the token is not the holder, else the holds left.
local holds = redis.call('HGET', KEYS[1], ARGV[1])
if not holds then
  return -1
end
holds = tonumber(holds) - 1
if holds > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], holds)
  return holds
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[2], KEYS[1])
return 0
