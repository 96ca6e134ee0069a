-- sale: sell one unit of an item, with no lock: check and decrement in one
-- script, and queue the order in the same step.
-- KEYS[1] the item's stock hash (field "value")   KEYS[2] the request's record
-- KEYS[3] the orders stream
-- ARGV[1] order id (the request's idempotency key)   ARGV[2] user   ARGV[3] item
-- ARGV[4] how long the request's record is kept, in milliseconds
-- Returns "ok" when sold (now or by an earlier copy of the request), or
-- "soldout".
local done = redis.call('GET', KEYS[2])
if done then
  return done
end
local stock = tonumber(redis.call('HGET', KEYS[1], 'value') or '0')
if stock <= 0 then
  return 'soldout'
end
redis.call('HINCRBY', KEYS[1], 'value', -1)
redis.call('XADD', KEYS[3], '*', 'order', ARGV[1], 'user', ARGV[2], 'item', ARGV[3])
redis.call('SET', KEYS[2], 'ok', 'PX', ARGV[4])
return 'ok'
