-- describe: the part shared by inspect.lua and force_release.lua, which are
-- this text followed by their own (scripts.go puts them together).
-- describe() returns {owner, fence, holds, pttl, held for in ms or -1,
-- 1 when in lock-delay else 0} for the lock KEYS[1], or nil when it is not
-- held.
local function describe()
  local fields = redis.call('HGETALL', KEYS[1])
  if #fields == 0 then
    return nil
  end
  local owner, fence, holds, at, exp = '', '0', 0, nil, nil
  for i = 1, #fields, 2 do
    local name, value = fields[i], fields[i + 1]
    if name == 'owner' then
      owner = value
    elseif name == 'fence' then
      fence = value
    elseif name == 'at' then
      at = tonumber(value)
    elseif name == 'exp' then
      exp = tonumber(value)
    elseif name ~= 'delay' then
      holds = holds + (tonumber(value) or 0)
    end
  end
  local t = redis.call('TIME')
  local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  local heldFor = -1
  if at then
    heldFor = now - at
  end
  -- With a lock-delay the key outlives the lease: report the lease's TTL,
  -- or once it expired, the time left in the delay.
  local pttl = redis.call('PTTL', KEYS[1])
  local delayed = 0
  if exp and now >= exp then
    delayed = 1
  elseif exp then
    pttl = exp - now
  end
  return {owner, fence, holds, pttl, heldFor, delayed}
end
