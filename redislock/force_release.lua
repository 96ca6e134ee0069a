-- force_release: delete the lock KEYS[1] whoever holds it, wake waiters and
-- describe what was removed. The fence counter is left alone on purpose.
-- ARGV[1] release channel
-- Returns {owner, fence, holds, pttl, held for in ms or -1}, or nil when it was not held.
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then
  return false
end
local owner, fence, holds, at = '', '0', 0, nil
for i = 1, #fields, 2 do
  local name, value = fields[i], fields[i + 1]
  if name == 'owner' then
    owner = value
  elseif name == 'fence' then
    fence = value
  elseif name == 'at' then
    at = tonumber(value)
  else
    holds = holds + (tonumber(value) or 0)
  end
end
local heldFor = -1
if at then
  local t = redis.call('TIME')
  heldFor = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) - at
end
local ttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], KEYS[1])
return {owner, fence, holds, ttl, heldFor}
