-- claim: the fenced read of a read-modify-write. Raise the item's accepted
-- fence to the reader's and return the stock, so that a holder whose lease
-- ran out, and who read before this one, can no longer write.
-- KEYS[1] the item's stock hash (fields "value", "fence")   KEYS[2] the request's record
-- ARGV[1] the lease's fence (decimal), or "" for the unfenced variant, which
-- neither checks nor raises it (to show what the fence prevents)
-- Returns {"stale"} when a newer fence has claimed the item, {"done", v} when
-- the request was already served (v its answer), else {"stock", n}.
-- Fences are compared as decimal strings (length, then bytes): Lua numbers
-- are doubles and lose precision past 2^53.
local function older(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end
if ARGV[1] ~= '' then
  local accepted = redis.call('HGET', KEYS[1], 'fence')
  if accepted and older(ARGV[1], accepted) then
    return {'stale'}
  end
  redis.call('HSET', KEYS[1], 'fence', ARGV[1])
end
local done = redis.call('GET', KEYS[2])
if done then
  return {'done', done}
end
return {'stock', redis.call('HGET', KEYS[1], 'value') or '0'}
