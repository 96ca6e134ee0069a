-- raise_fence: give the grant a token holds the fence ARGV[2], and raise the
-- fence counter to at least ARGV[2] so that later grants draw larger ones.
-- Redlock uses it to give one grant the same fence on all its nodes.
-- KEYS[1] lock hash   KEYS[2] fence counter   ARGV[1] token   ARGV[2] fence
-- Returns 1 when done, 0 when the token is not the holder.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then
  return 0
end
local exp = redis.call('HGET', KEYS[1], 'exp')
if exp then
  local t = redis.call('TIME')
  if tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) >= tonumber(exp) then
    return 0
  end
end
local fence = tonumber(ARGV[2])
if tonumber(redis.call('GET', KEYS[2]) or '0') < fence then
  redis.call('SET', KEYS[2], ARGV[2])
end
redis.call('HSET', KEYS[1], 'fence', ARGV[2])
return 1
