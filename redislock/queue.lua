-- queue: the helpers that hand an exclusive lock to the head of the fair
-- queue, which release.lua's handoff fast path needs before the rest of
-- common.lua is defined (Lua makes a script's functions as it runs, and
-- each costs the server time). scripts.go puts this text in place of the
-- line "--#queue", and in front of common.lua in the other scripts.

-- int returns the integer n as a decimal string. Redis 7.0 and earlier
-- turn a number passed to redis.call into text with a printf of %.17g, a
-- few times what this costs.
local function int(n)
  return string.format('%d', n)
end

-- now returns the server's clock in ms, read once per script.
local clock
local function now()
  if not clock then
    local t = redis.call('TIME')
    clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return clock
end

-- The fair queue is three keys written together: Q (token → arrival
-- number), QE (token → entry expiry) and QO (token → owner, for the
-- exclusive entries whose request accepts a direct handoff; see handOff;
-- byte 1 + token → "limit owner" for such shared entries (a reader's limit
-- is 0); NUL + token → the id of the client's handoff channel, from
-- clients that have one; and byte 2 + token → the entry's QueueTTL in ms
-- when its client keeps its place, so that a release that hands it the
-- lock queues its successor, else "0": see queueSuccessor). Shared entries
-- keep their owner under their own field so that a release of a client
-- before them, which knows only exclusive handoffs, takes them for entries
-- that accept none.

-- fitQueue gives the queue's keys the expiry of its latest entry, or
-- deletes them when it is empty. (PEXPIREAT of a missing QO does nothing.)
local function fitQueue(Q, QE, QO)
  local last = redis.call('ZRANGE', QE, '-1', '-1', 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', Q, QE, QO)
    return
  end
  redis.call('PEXPIREAT', QE, last[2])
  redis.call('PEXPIREAT', Q, last[2])
  redis.call('PEXPIREAT', QO, last[2])
end

-- dropEntry takes token's entry, which Q no longer holds, out of QE and QO.
-- The keys expire no sooner than the latest entry (every write fits or
-- stretches them; pruning takes only entries that expired before it), so
-- they are fitted again only when token's entry was that one: then to the
-- entry before it, read with it (what fitQueue would read after). tail is
-- QE's last two entries with their expiries when the caller read them.
local function dropEntry(Q, QE, QO, token, tail)
  tail = tail or redis.call('ZRANGE', QE, '-2', '-1', 'WITHSCORES')
  redis.call('ZREM', QE, token)
  redis.call('HDEL', QO, token, '\0' .. token, '\1' .. token, '\2' .. token)
  if #tail == 0 then
    fitQueue(Q, QE, QO) -- QE lacked token (no script does that)
  elseif tail[#tail - 1] == token then
    if #tail == 2 then
      redis.call('DEL', Q, QE, QO)
    else
      redis.call('PEXPIREAT', QE, tail[2])
      redis.call('PEXPIREAT', Q, tail[2])
      redis.call('PEXPIREAT', QO, tail[2])
    end
  end
end

-- headOf reads the fair queue's head, the head's owner, handoff channel
-- id, shared entry ("limit owner") and kept place's QueueTTL (HMGET of QO)
-- and its entry's expiry (ms), and, for a head with an owner, QE's last two entries with their
-- expiries (for dropEntry: the head's is read there when it is one of
-- them). Nothing else is read for a head that is token.
local function headOf(Q, QE, QO, token)
  local head = redis.call('ZRANGE', Q, '0', '0')[1]
  if not head or head == token then
    return head
  end
  local o = redis.call('HMGET', QO, head, '\0' .. head, '\1' .. head, '\2' .. head)
  local exp, tail
  if o[1] or o[3] then
    tail = redis.call('ZRANGE', QE, '-2', '-1', 'WITHSCORES')
    for i = 1, #tail, 2 do
      if tail[i] == head then
        exp = tonumber(tail[i + 1])
      end
    end
  end
  exp = exp or tonumber(redis.call('ZSCORE', QE, head))
  return head, exp, o, tail
end

-- grantHead grants the lock (hash L, fence counter F) to head, the fair
-- queue's head, whose entry expires at exp (ms) and whose owner is owner,
-- as a direct handoff, and returns the fence it drew. The grant is marked
-- 'ho' (its rid) until the head's next request claims it; its key expires
-- with the head's entry, so that a head that died leaves the lock no
-- later than its entry would have (see handOff in common.lua).
local function grantHead(L, F, head, owner, exp)
  local fence = redis.call('INCR', F)
  redis.call('HSET', L, head, '1', 'owner', owner, 'fence', int(fence), 'at', int(now()), 'rid', 'ho')
  redis.call('PEXPIREAT', L, int(exp))
  return fence
end

-- publishGrants announces handOff's grants given, with publish (PUBLISH or
-- SPUBLISH), each to its head's client alone when it has a handoff channel
-- (the other waiters have nothing to do on a handoff: the lock is not free
-- for them), else on the release channel channel (NS:{K}:rel); an
-- exclusive grant also on the observers' channel. next, handOff's second
-- answer after handBatch grants or before an entry that takes no
-- handoff, is named on the release channel.
local function publishGrants(given, next, publish, channel)
  local base = string.sub(channel, 1, -5) -- NS:{K}, from NS:{K}:rel
  for _, g in ipairs(given) do
    local msg = 'next:' .. g[1] .. '\0' .. int(g[2])
    if g[5] then
      msg = msg .. '\0s' -- the head's successor is queued (queueSuccessor)
    end
    if g[3] then
      redis.pcall(publish, base .. ':ho:' .. g[3] .. ':rel', msg)
      if not g[4] then
        -- And to the lock's observers (elections, which observe exclusive
        -- grants), which no waiter's channel reaches: a publish that
        -- nobody hears costs a lookup.
        redis.pcall(publish, base .. ':ho:rel', msg)
      end
    else
      redis.pcall(publish, channel, msg)
    end
  end
  if next then
    -- handBatch holds were handed over, or the next head takes no
    -- handoff: it may come in too.
    redis.pcall(publish, channel, 'next:' .. next)
  end
end

-- successor returns the token that takes the place of token's client in
-- the queue after token, as driver.Successor does: token with the number
-- after its last dot raised by one, when that is a decimal of up to 15
-- digits without a leading zero, else token with ".1" added.
local function successor(token)
  local base, n = string.match(token, '^(.*)%.(%d+)$')
  if base and #n <= 15 and (string.sub(n, 1, 1) ~= '0' or n == '0') then
    return base .. '.' .. int(tonumber(n) + 1)
  end
  return token .. '.1'
end

-- queueSuccessor puts the successor of head, which a release has just
-- granted the lock to, at the tail of the queue, when head's client keeps
-- its place there (o, head's fields read by headOf, holds head's QueueTTL
-- in its fourth field, else "0"): the successor's entry has head's owner
-- and handoff channel, and head's entry's expiry exp, so that a client
-- that stopped asking (it died) keeps no place past the entry of its last
-- request, however many times the lock comes round to its successors. It
-- reports whether the successor is queued. The client's next waiter on the
-- lock takes the successor's token, so that a hand-over between two
-- waiters of one client costs it no request to join the queue again.
--
-- A successor whose token the client gave up already (a clean-up that
-- found it holding nothing recorded it in the late-request record X,
-- which exists when xLive) is not queued: nobody would take it. One that
-- a request of its own queued (the client went on with the token after a
-- request of head's whose answer it lost) keeps that request's entry,
-- expiry and owner, which the client counts on.
local function queueSuccessor(Q, QE, QO, X, xLive, head, o, exp)
  local qttl = tonumber(o[4] or '0') or 0
  if qttl <= 0 then
    return false
  end
  local succ = successor(head)
  if xLive and (tonumber(redis.call('ZSCORE', X, 't' .. succ)) or 0) > now() then
    return false
  end
  if redis.call('ZADD', QE, 'NX', int(exp), succ) == 0 then
    return tonumber(redis.call('ZSCORE', QE, succ)) > now()
  end
  local last = redis.call('ZRANGE', Q, '-1', '-1', 'WITHSCORES')
  redis.call('ZADD', Q, 'NX', int((tonumber(last[2]) or 0) + 1), succ)
  if o[2] then
    redis.call('HSET', QO, succ, o[1], '\0' .. succ, o[2], '\2' .. succ, o[4])
  else
    redis.call('HSET', QO, succ, o[1], '\2' .. succ, o[4])
  end
  -- The keys outlive the entry as acquire.lua's stretchQueue leaves them:
  -- head's drop fitted them to the entry before it when head's was the
  -- latest, or deleted them with the last entry; QO also when head's
  -- fields were its last (entries that take no handoff have none), so it
  -- is looked at on its own.
  local at = exp + math.floor(qttl / 4)
  local p = redis.call('PTTL', QE)
  if p < 0 or now() + p < at then
    redis.call('PEXPIREAT', QE, int(at))
    redis.call('PEXPIREAT', Q, int(at))
  end
  p = redis.call('PTTL', QO)
  if p < 0 or now() + p < at then
    redis.call('PEXPIREAT', QO, int(at))
  end
  return true
end
