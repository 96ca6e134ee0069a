-- late: the record of what a request that lands late must not be granted
-- (see keys.go, NS:{K}:late). scripts.go puts this text in front of
-- release.lua and withdraw.lua; acquire.lua only reads the record.
--
-- The record is a zset: 'r' + a request id → until, for the acquire
-- requests whose grant a release deleted (go-redis may still deliver a
-- copy of one of them); 't' + a token → until, for a token released
-- without a fence (a clean-up) while it held nothing; 'w' + a token →
-- until, for a token withdrawn from the queue. until is the server's clock
-- in ms + lateTTL. Every write prunes the entries that expired and keeps
-- the newest lateMax, and gives the key lateTTL, the expiry of its newest
-- entry: the record never outlives lateTTL after its last write, and never
-- holds more than lateMax + the entries of one call.
local lateTTL, lateMax = 5000, 4096

-- remember adds members to the record x, each until now + lateTTL, and
-- reports whether it wrote; ms is now (the server's clock in ms) when the
-- caller read it already. fresh is true when the caller knows that x does
-- not exist: then what it writes holds nothing to prune (all its entries
-- are live, and fewer than lateMax), so it is not pruned.
local function remember(x, members, ms, fresh)
  if #members == 0 then
    return false
  end
  if not ms then
    local t = redis.call('TIME')
    ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  local till = string.format('%d', ms + lateTTL)
  local args = {}
  for i, m in ipairs(members) do
    args[2 * i - 1], args[2 * i] = till, m
  end
  redis.call('ZADD', x, unpack(args))
  if not fresh then
    redis.call('ZREMRANGEBYSCORE', x, '-inf', string.format('%d', ms))
    redis.call('ZREMRANGEBYRANK', x, 0, -lateMax - 1)
  end
  redis.call('PEXPIRE', x, lateTTL)
  return true
end

-- served returns the members of the record for the ids rids (the 'rid'
-- field of a grant being deleted: the requests that made it or entered it
-- again), and for token when the grant was handed to it and never claimed
-- ('ho') and the release is a clean-up (cleanup): the request that would
-- have claimed it may still be on its way.
local function served(rids, token, cleanup)
  local out = {}
  if rids == 'ho' then
    if cleanup then
      out[1] = 't' .. token
    end
    return out
  end
  for id in string.gmatch(rids or '', '%S+') do
    out[#out + 1] = 'r' .. id
  end
  return out
end
