-- proclaim: set the owner of the token's exclusive grant, when the token
-- holds the lock with that grant's fence, its lease has not expired (see
-- leaseState) and no proclaim with this or a later sequence number was
-- applied to the grant. The hash's 'pseq' field is "fence seq" of the
-- last applied proclaim (not a number, so no reader counts it as holds).
-- KEYS[1] lock hash
-- ARGV[1] token   ARGV[2] fence, or "" for the token's grant whatever its
-- fence   ARGV[3] owner   ARGV[4] sequence number
-- Returns 1 when the grant holds the lock (applied or not), 0 otherwise.
local L = KEYS[1]
local h = redis.call('HMGET', L, ARGV[1], 'fence', 'pseq', 'delay')
if not h[1] or (ARGV[2] ~= '' and h[2] ~= ARGV[2]) then
  return 0
end
local delay = tonumber(h[4] or '0') or 0
if delay > 0 and redis.call('PTTL', L) <= delay then
  return 0 -- expired: the key only sits out its lock-delay
end
local pf, ps = string.match(h[3] or '', '^(%d+) (%d+)$')
if pf == h[2] and tonumber(ps) >= tonumber(ARGV[4]) then
  return 1 -- a later proclaim was applied: this one lands late
end
redis.call('HSET', L, 'owner', ARGV[3], 'pseq', h[2] .. ' ' .. ARGV[4])
return 1
