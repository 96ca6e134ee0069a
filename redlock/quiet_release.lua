-- quiet_release: drop one hold of a token, as redislock's release.lua does,
-- but without announcing it on the release channel. Redlock undoes with it
-- the grants of an acquire attempt that did not win a quorum: announcing
-- those would wake the other waiters, whose own failed attempts would
-- announce theirs, and so on for as long as the holder keeps a quorum.
-- KEYS[1] lock hash   ARGV[1] token
-- Returns -1 when the token is not the holder, else the holds left.
local holds = redis.call('HGET', KEYS[1], ARGV[1])
if not holds then
  return -1
end
local exp = redis.call('HGET', KEYS[1], 'exp')
if exp then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) >= tonumber(exp) then
    redis.call('DEL', KEYS[1]) -- expired and in its lock-delay: done with it
    return -1
  end
end
holds = tonumber(holds) - 1
if holds > 0 then
  redis.call('HSET', KEYS[1], ARGV[1], holds)
  return holds
end
redis.call('DEL', KEYS[1])
return 0
