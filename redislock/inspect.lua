-- inspect: describe the lock KEYS[1] without changing it.
-- Returns {owner, fence, holds, pttl}, or nil when it is not held.
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
return {owner, fence, holds, redis.call('PTTL', KEYS[1])}
