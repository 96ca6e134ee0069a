-- fenced_sale: the fenced write of a read-modify-write done under a lock:
-- store the stock the holder computed, and queue the order in the same step,
-- unless a newer fence has claimed the item since the holder read it.
-- KEYS[1] the item's stock hash (fields "value", "fence")   KEYS[2] the request's record
-- KEYS[3] the orders stream   KEYS[4] the count of late writes refused
-- ARGV[1] the lease's fence (decimal), or "" for the unfenced variant, which
-- does not check it (to show what the fence prevents)   ARGV[2] the new stock
-- ARGV[3] order id   ARGV[4] user   ARGV[5] item
-- ARGV[6] how long the request's record is kept, in milliseconds
-- Returns "ok" (sold now, or by an earlier copy of this request), or
-- "stale" (nothing written).
-- The request's record is checked first: go-redis sends a script again
-- when the connection broke before the reply (MaxRetries), and the first
-- copy may have run. Without the check the copy queued the order twice.
local function older(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end
if ARGV[1] ~= '' then
  local accepted = redis.call('HGET', KEYS[1], 'fence')
  if accepted and older(ARGV[1], accepted) then
    redis.call('INCR', KEYS[4])
    return 'stale'
  end
end
local done = redis.call('GET', KEYS[2])
if done then
  return done
end
if ARGV[1] ~= '' then
  redis.call('HSET', KEYS[1], 'value', ARGV[2], 'fence', ARGV[1])
else
  redis.call('HSET', KEYS[1], 'value', ARGV[2])
end
redis.call('XADD', KEYS[3], '*', 'order', ARGV[3], 'user', ARGV[4], 'item', ARGV[5])
redis.call('SET', KEYS[2], 'ok', 'PX', ARGV[6])
return 'ok'
