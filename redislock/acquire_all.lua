-- acquire_all: grant the exclusive locks of several keys to one token in
-- one step, or none (driver.MultiAcquirer). scripts.go puts common.lua in
-- place of the line "--#common".
-- KEYS, five per lock, in the caller's order: the lock hash, the fence
-- counter, the shared holds (zset), their details, the late-request record
-- ARGV[1] token   ARGV[2] owner   ARGV[3] ttl in ms   ARGV[4] the request's id
-- Returns {1, fence1, fence2, ...} when granted, or {0, i, holder owner,
-- holder pttl} when lock i (1-based) refused it: held, expired but kept
-- for its lock-delay, with live shared holds, or, with owner '', a record
-- of the late-request record refused the request (see acquire.lua).
--
-- Each grant is the one acquire.lua makes (the hash's token, owner, fence,
-- at and rid), so renew, release and the late-request record treat it
-- alike. A copy of this request that go-redis resends after the first ran
-- finds every lock held by token under this request's id, and gets the
-- grants back unchanged.
--#common
local token, owner, ttl, rid = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local n = #KEYS / 5
local function key(i, j)
  return KEYS[5 * (i - 1) + j]
end

for i = 1, n do
  local X = key(i, 5)
  local till = math.max(tonumber(redis.call('ZSCORE', X, 'r' .. rid)) or 0,
    tonumber(redis.call('ZSCORE', X, 't' .. token)) or 0)
  if till > now() then
    return {0, i, '', till - now()}
  end
end

local resent = {1}
for i = 1, n do
  local hm = redis.call('HMGET', key(i, 1), token, 'rid', 'fence')
  if not hm[1] or not string.find(' ' .. (hm[2] or '') .. ' ', ' ' .. rid .. ' ', 1, true) then
    resent = nil
    break
  end
  resent[i + 1] = tonumber(hm[3])
end
if resent then
  return resent
end

for i = 1, n do
  local L, S, SI = key(i, 1), key(i, 3), key(i, 4)
  if redis.call('EXISTS', L) == 1 then
    return {0, i, redis.call('HGET', L, 'owner') or '', redis.call('PTTL', L)}
  end
  if redis.call('EXISTS', S) == 1 then
    prune(S, SI, 'HDEL')
    if redis.call('ZCARD', S) > 0 then
      local last = redis.call('ZRANGE', S, '-1', '-1', 'WITHSCORES')
      local _, _, holder = holdDetails(redis.call('HGET', SI, last[1]))
      return {0, i, holder, tonumber(last[2]) - now()}
    end
    fit(S, SI)
  end
end

local out = {1}
local at = string.format('%d', now())
for i = 1, n do
  local L = key(i, 1)
  local fence = redis.call('INCR', key(i, 2))
  redis.call('HSET', L, token, '1', 'owner', owner, 'fence', string.format('%d', fence), 'at', at, 'rid', rid)
  redis.call('PEXPIRE', L, ttl)
  out[i + 1] = fence
end
return out
