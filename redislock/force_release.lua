-- force_release: delete the lock KEYS[1] whoever holds it, wake waiters and
-- describe what was removed. The fence counter is left alone on purpose.
-- ARGV[1] release channel
-- Returns {owner, fence, holds, pttl}, or nil when it was not held.
local fields = redis.call('HGETALL', KEYS[1])
if #fields == 0 then
  return false
end
local owner, fence, holds = '', '0', 0
for i = 1, #fields, 2 do
  local name, value = fields[i], fields[i + 1]
  if name == 'owner' then
    owner = value
  elseif name == 'fence' then
    fence = value
  else
    holds = holds + (tonumber(value) or 0)
  end
end
local ttl = redis.call('PTTL', KEYS[1])
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[1], KEYS[1])
return {owner, fence, holds, ttl}
