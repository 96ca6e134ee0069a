-- withdraw: take a waiter out of the fair queue and withdraw its writer
-- intent, without touching any hold; wake waiters when that lets another
-- in, as release.lua does. scripts.go puts common.lua in place of the line
-- "--#common".
-- KEYS[1] lock hash   KEYS[2] shared holds   KEYS[3] shared holds' details
-- KEYS[4] writer intent   KEYS[5] fair queue   KEYS[6] fair queue's expiries
-- KEYS[7] recent releases (unused)   KEYS[8] fair queue's owners: release.lua's
-- KEYS, with KEYS[10] the late-request record (see late.lua, which
-- scripts.go puts in front of this script)   ARGV[1] token
-- ARGV[2] release channel
-- ARGV[3] the publish command: PUBLISH, or SPUBLISH on a Cluster
-- ARGV[4] (absent from clients before it) the ids, space-separated, of
-- the token's acquire requests of which a copy may still land (their
-- answers were never read), or "": recorded with the withdrawal, so that
-- such a copy grants nothing either
-- The withdrawal is recorded (late.lua): a request of token still on its
-- way queues nothing and records no intent when it lands, for lateTTL.
-- Returns 1 when something of token's was removed, else 0. A refused
-- publish (an ACL without the channel) does not undo the withdrawal.
local L, S, SI, W, Q, QE, QO, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[8], KEYS[10]
local token = ARGV[1]
local ms = {'w' .. token}
for id in string.gmatch(ARGV[4] or '', '%S+') do
  ms[#ms + 1] = 'r' .. id
end
-- EXISTS W Q Q X X X X: its answer % 4 is leave's n (see leave in
-- common.lua), and it is 4 or more when the record X exists, which a
-- record written afresh needs no pruning of (see remember).
local n = redis.call('EXISTS', W, Q, Q, X, X, X, X)
local fresh = n < 4
n = n % 4
if n == 0 then
  remember(X, ms, nil, fresh)
  return 0
end

--#common
remember(X, ms, now(), fresh) -- one TIME with the queue's prune
local intent, entry, headLeft = leave(L, S, W, Q, QE, QO, token, n)
if intent or headLeft then
  announce(L, Q, QE, QO, ARGV[3], ARGV[2], intent)
end
if intent or entry then
  return 1
end
return 0
