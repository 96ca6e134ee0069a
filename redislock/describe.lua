-- describe (after common.lua): the part shared by inspect.lua and
-- force_release.lua, which are this text followed by their own (scripts.go
-- puts them together). It changes nothing.
-- KEYS[1] lock hash   KEYS[2] shared holds   KEYS[3] shared holds' details
-- KEYS[4] writer intent   KEYS[5] fair queue   KEYS[6] fair queue's expiries
-- describe() returns {owner, fence, holds, pttl, held for in ms or -1,
-- 1 when in lock-delay else 0, live queue entries, 1 when a writer intent
-- is live else 0, limit of the newest shared hold, {{owner, fence, pttl}
-- of each live shared hold}} for the lock KEYS[1], or nil when it has
-- neither an exclusive holder nor a live shared hold. Without an exclusive
-- holder, owner is "", fence "0", holds 0, pttl -2 and held for -1.
local function describe()
  local owner, fence, holds, pttl, heldFor, delayed = '', '0', 0, -2, -1, 0
  local fields = redis.call('HGETALL', KEYS[1])
  if #fields > 0 then
    local at, delay
    for i = 1, #fields, 2 do
      local name, value = fields[i], fields[i + 1]
      if name == 'owner' then
        owner = value
      elseif name == 'fence' then
        fence = value
      elseif name == 'at' then
        at = tonumber(value)
      elseif name == 'delay' then
        delay = tonumber(value)
      elseif name ~= 'exp' and name ~= 'rid' and name ~= 'rrid' and name ~= 'pseq' then -- 'exp': kept by grants of earlier versions
        holds = holds + (tonumber(value) or 0)
      end
    end
    if at then
      heldFor = now() - at
    end
    -- With a lock-delay the key outlives the lease: report the lease's
    -- TTL, or once it expired, the time left in the delay.
    pttl = redis.call('PTTL', KEYS[1])
    if delay and delay > 0 then
      if pttl <= delay then
        delayed = 1
      else
        pttl = pttl - delay
      end
    end
  end
  local shared, limit, newest = {}, 0, -1
  local live = redis.call('ZRANGEBYSCORE', KEYS[2], string.format('(%d', now()), '+inf', 'WITHSCORES')
  if #live > 0 then
    local details = {}
    local all = redis.call('HGETALL', KEYS[3])
    for i = 1, #all, 2 do
      details[all[i]] = all[i + 1]
    end
    for i = 1, #live, 2 do
      local f, l, o = holdDetails(details[live[i]])
      shared[#shared + 1] = {o, f, tonumber(live[i + 1]) - now()}
      if tonumber(f) > newest then
        newest, limit = tonumber(f), l
      end
    end
  end
  if #fields == 0 and #shared == 0 then
    return nil
  end
  local queued = redis.call('ZCOUNT', KEYS[6], string.format('(%d', now()), '+inf')
  local writer = redis.call('EXISTS', KEYS[4])
  return {owner, fence, holds, pttl, heldFor, delayed, queued, writer, limit, shared}
end
