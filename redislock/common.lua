-- common: helpers of the scripts that handle shared holds, writer intents
-- and fair queues (acquire, renew, release, describe); scripts.go puts this
-- text before theirs.
--
-- A lock's shared holds are a zset (token → expiry, ms by the server's
-- clock) and a hash of their details (token → "fence limit owner"); its
-- fair queue is a zset of expiries (token → expiry) and one of arrival
-- numbers (token → number). Each pair is written together and carries the
-- expiry of its latest entry, so it vanishes with it.

-- now returns the server's clock in ms, read once per script.
local clock
local function now()
  if not clock then
    local t = redis.call('TIME')
    clock = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  end
  return clock
end

-- prune drops the entries of the expiry zset z that expired by now(), and
-- the same members of side with rem ('HDEL' for a hash, 'ZREM' for a zset).
local function prune(z, side, rem)
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', now())
  if #gone == 0 then
    return
  end
  redis.call('ZREMRANGEBYSCORE', z, '-inf', now())
  for i = 1, #gone, 1000 do -- unpack has a limit on its results
    redis.call(rem, side, unpack(gone, i, math.min(i + 999, #gone)))
  end
end

-- fit gives the expiry zset z and its side the expiry of z's latest entry,
-- or deletes both when z is empty.
local function fit(z, side)
  local last = redis.call('ZRANGE', z, -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', z, side)
    return
  end
  redis.call('PEXPIREAT', z, last[2])
  redis.call('PEXPIREAT', side, last[2])
end

-- leaseState returns the lock-delay of the exclusive grant in hash l (0
-- without one) and whether its lease has expired. A grant with a delay
-- keeps the key delay ms past its lease (PEXPIRE ttl + delay, renewed the
-- same way), so the lease has expired once the key's PTTL is down to the
-- delay: no field needs writing when it is renewed, which keeps renewals
-- working when Redis refuses writes that need memory (noeviction at
-- maxmemory), as plain ones do.
local function leaseState(l)
  local delay = tonumber(redis.call('HGET', l, 'delay') or '0') or 0
  if delay <= 0 then
    return 0, false
  end
  return delay, redis.call('PTTL', l) <= delay
end

-- holdDetails splits a shared hold's details into fence (a decimal
-- string), limit and owner.
local function holdDetails(v)
  local fence, limit, owner = string.match(v or '', '^(%d+) (%d+) (.*)$')
  return fence or '0', tonumber(limit) or 0, owner or ''
end

-- leave takes token's writer intent and fair queue entry off the lock (KEYS
-- as named in release.lua) and returns whether it had an intent (its going
-- concerns every waiter), whether it had an entry, and whether it was the
-- head of the queue and left the lock free, so that the next may go.
local function leave(L, S, W, Q, QE, token)
  local intent, entry, headLeft = false, false, false
  if redis.call('HGET', W, 't') == token then
    redis.call('DEL', W)
    intent = true
  end
  if redis.call('ZSCORE', Q, token) then
    prune(QE, Q, 'ZREM')
    local head = redis.call('ZRANGE', Q, 0, 0)[1]
    if redis.call('ZREM', Q, token) == 1 then
      entry = true
      redis.call('ZREM', QE, token)
      fit(QE, Q)
      headLeft = head == token and redis.call('EXISTS', L) == 0 and
          redis.call('ZCOUNT', S, string.format('(%d', now()), '+inf') == 0
    end
  end
  return intent, entry, headLeft
end

-- announce publishes "next:" on channel with publish (PUBLISH or SPUBLISH),
-- followed by the fair queue's head when the lock is free with a live queue
-- and the news is for the head alone (not anyone). A refused publish (an
-- ACL without the channel) does not undo what the script did.
local function announce(L, Q, QE, publish, channel, anyone)
  local next = ''
  if not anyone and redis.call('EXISTS', L) == 0 and redis.call('EXISTS', Q) == 1 then
    prune(QE, Q, 'ZREM')
    next = redis.call('ZRANGE', Q, 0, 0)[1] or ''
  end
  redis.pcall(publish, channel, 'next:' .. next)
end
