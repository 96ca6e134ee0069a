-- withdraw: take a waiter out of the fair queue and withdraw its writer
-- intent, without touching any hold; wake waiters when that lets another
-- in, as release.lua does. scripts.go puts common.lua in place of the line
-- "--#common".
-- KEYS[1] lock hash   KEYS[2] shared holds   KEYS[3] shared holds' details
-- KEYS[4] writer intent   KEYS[5] fair queue   KEYS[6] fair queue's expiries
-- ARGV[1] token   ARGV[2] release channel
-- ARGV[3] the publish command: PUBLISH, or SPUBLISH on a Cluster
-- Returns 1 when something of token's was removed, else 0. A refused
-- publish (an ACL without the channel) does not undo the withdrawal.
local L, S, SI, W, Q, QE = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local token = ARGV[1]
if redis.call('EXISTS', W, Q) == 0 then
  return 0
end

--#common
local removed, notify, anyone = 0, false, false
if redis.call('HGET', W, 't') == token then
  redis.call('DEL', W)
  removed, notify, anyone = 1, true, true
end
if redis.call('ZSCORE', Q, token) then
  prune(QE, Q, 'ZREM')
  local head = redis.call('ZRANGE', Q, 0, 0)[1]
  if redis.call('ZREM', Q, token) == 1 then
    removed = 1
    redis.call('ZREM', QE, token)
    fit(QE, Q)
    -- The head gave up while the lock was free: the next one may go.
    if head == token and redis.call('EXISTS', L) == 0 and
        redis.call('ZCOUNT', S, string.format('(%d', now()), '+inf') == 0 then
      notify = true
    end
  end
end
if notify then
  local next = ''
  if not anyone and redis.call('EXISTS', L) == 0 and redis.call('EXISTS', Q) == 1 then
    prune(QE, Q, 'ZREM')
    next = redis.call('ZRANGE', Q, 0, 0)[1] or ''
  end
  redis.pcall(ARGV[3], ARGV[2], 'next:' .. next)
end
return removed
