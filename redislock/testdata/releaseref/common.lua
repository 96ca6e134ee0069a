-- common: helpers of the scripts that handle shared holds, writer intents
-- and fair queues (acquire, renew, release, describe); scripts.go puts this
-- text before theirs.
--
-- A lock's shared holds are a zset (token → expiry, ms by the server's
-- clock) and a hash of their details (token → "fence limit owner"); its
-- fair queue is a zset of expiries (token → expiry) and one of arrival
-- numbers (token → number). Each pair is written together and carries the
-- expiry of its latest entry, so it vanishes with it (the queue's keys:
-- that expiry or one up to a quarter of a QueueTTL later; see
-- stretchQueue in acquire.lua).

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
-- the same members of side with rem ('HDEL' for a hash, 'ZREM' for a zset),
-- and returns them.
local function prune(z, side, rem)
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', now())
  if #gone == 0 then
    return gone
  end
  redis.call('ZREMRANGEBYSCORE', z, '-inf', now())
  for i = 1, #gone, 1000 do -- unpack has a limit on its results
    redis.call(rem, side, unpack(gone, i, math.min(i + 999, #gone)))
  end
  return gone
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

-- The fair queue is three keys written together: Q (token → arrival
-- number), QE (token → entry expiry) and QO (token → owner, for the
-- entries whose request accepts a direct handoff; see handOff, and NUL +
-- token → the id of the client's handoff channel, from clients that have
-- one).

-- pruneQueue drops the queue's expired entries.
local function pruneQueue(Q, QE, QO)
  local gone = prune(QE, Q, 'ZREM')
  for i = 1, #gone, 500 do
    local fields = {}
    for j = i, math.min(i + 499, #gone) do
      fields[#fields + 1] = gone[j]
      fields[#fields + 1] = '\0' .. gone[j]
    end
    redis.call('HDEL', QO, unpack(fields))
  end
end

-- fitQueue gives the queue's keys the expiry of its latest entry, or
-- deletes them when it is empty. (PEXPIREAT of a missing QO does nothing.)
local function fitQueue(Q, QE, QO)
  local last = redis.call('ZRANGE', QE, -1, -1, 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', Q, QE, QO)
    return
  end
  redis.call('PEXPIREAT', QE, last[2])
  redis.call('PEXPIREAT', Q, last[2])
  redis.call('PEXPIREAT', QO, last[2])
end

-- unqueue takes token's entry out of the queue; it reports whether it had
-- one. The keys expire no sooner than the latest entry (every write fits
-- or stretches them; pruning takes only entries that expired before it),
-- so they are fitted again only when token's entry was that one.
local function unqueue(Q, QE, QO, token)
  if redis.call('ZREM', Q, token) == 0 then
    return false
  end
  local last = redis.call('ZRANGE', QE, -1, -1)[1]
  redis.call('ZREM', QE, token)
  redis.call('HDEL', QO, token, '\0' .. token)
  if last == nil or last == token then
    fitQueue(Q, QE, QO)
  end
  return true
end

-- leaseState returns the lock-delay of the exclusive grant in hash l (0
-- without one) and whether its lease has expired. A grant with a delay
-- keeps the key delay ms past its lease (PEXPIRE ttl + delay, renewed the
-- same way), so the lease has expired once the key's PTTL is down to the
-- delay: no field needs writing when it is renewed, which keeps renewals
-- working when Redis refuses writes that need memory (noeviction at
-- maxmemory), as plain ones do.
-- A caller that read the field already passes it as d (false when
-- absent).
local function leaseState(l, d)
  if d == nil then
    d = redis.call('HGET', l, 'delay')
  end
  local delay = tonumber(d or '0') or 0
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
-- head of the queue and left the lock free, so that the next may go. n,
-- when the caller has it, is the answer of EXISTS W Q Q (odd: W exists; 2
-- or more: Q exists): a missing key is not read.
local function leave(L, S, W, Q, QE, QO, token, n)
  local intent, entry, headLeft = false, false, false
  if (not n or n % 2 == 1) and redis.call('HGET', W, 't') == token then
    redis.call('DEL', W)
    intent = true
  end
  if (not n or n >= 2) and redis.call('ZSCORE', Q, token) then
    pruneQueue(Q, QE, QO)
    local head = redis.call('ZRANGE', Q, 0, 0)[1]
    if unqueue(Q, QE, QO, token) then
      entry = true
      headLeft = head == token and redis.call('EXISTS', L) == 0
      if headLeft and redis.call('ZCOUNT', S, string.format('(%d', now()), '+inf') > 0 then
        -- Live shared holds: the next may join them unless it is an
        -- exclusive entry that takes a handoff.
        local next = redis.call('ZRANGE', Q, 0, 0)[1]
        headLeft = next ~= nil and redis.call('HEXISTS', QO, next) == 0
      end
    end
  end
  return intent, entry, headLeft
end

-- handOff grants the lock, when it is free of exclusive and live shared
-- holds, to the live head of the fair queue if the head's request accepts
-- a direct handoff (it has an owner in QO). The grant is marked 'ho' (its
-- rid) until the head's next request claims it, and its key expires with
-- the head's entry (the head's last request + its QueueTTL), so that a
-- head that died leaves the lock no later than its entry would have. It
-- returns the head, the grant's fence and the id of the head's client's
-- handoff channel (false when it has none), or nil. freed is true when the
-- caller has just deleted an exclusive grant: then the lock is free of
-- live shared holds too, with no need to look (no shared hold is granted
-- or renewed while an exclusive grant exists, and an exclusive grant is
-- made only when no shared hold is live).
local function handOff(L, F, S, Q, QE, QO, freed)
  if not freed and redis.call('EXISTS', L) == 0 and redis.call('ZCOUNT', S, string.format('(%d', now()), '+inf') > 0 then
    -- A live head that takes a handoff, kept out by live shared holds:
    -- the release announces nothing (its second answer, blocked).
    local head = redis.call('ZRANGE', Q, 0, 0)[1]
    local exp = head and tonumber(redis.call('ZSCORE', QE, head))
    if head and (not exp or exp <= now()) then
      pruneQueue(Q, QE, QO)
      head = redis.call('ZRANGE', Q, 0, 0)[1]
      exp = head and tonumber(redis.call('ZSCORE', QE, head))
    end
    if head and exp and exp > now() and redis.call('HGET', QO, head) then
      return nil, true
    end
    return nil
  end
  if not freed and (redis.call('EXISTS', L) == 1 or redis.call('ZCOUNT', S, string.format('(%d', now()), '+inf') > 0) then
    return nil
  end
  -- The queue is pruned only when its head's entry has expired: pruning
  -- takes a command every time, and every enqueue prunes anyway.
  local head = redis.call('ZRANGE', Q, 0, 0)[1]
  if not head then
    return nil
  end
  local exp = tonumber(redis.call('ZSCORE', QE, head))
  if not exp or exp <= now() then
    pruneQueue(Q, QE, QO)
    head = redis.call('ZRANGE', Q, 0, 0)[1]
    if not head then
      return nil
    end
    exp = tonumber(redis.call('ZSCORE', QE, head))
    if not exp or exp <= now() then
      return nil
    end
  end
  local o = redis.call('HMGET', QO, head, '\0' .. head)
  local owner, hid = o[1], o[2]
  if not owner then
    return nil
  end
  local fence = redis.call('INCR', F)
  redis.call('HSET', L, head, 1, 'owner', owner, 'fence', string.format('%d', fence), 'at', now(), 'rid', 'ho')
  redis.call('PEXPIREAT', L, exp)
  if redis.call('HGET', W, 't') == head then
    redis.call('DEL', W) -- the head's wait ends: its writer intent goes
  end
  unqueue(Q, QE, QO, head)
  return head, fence, hid
end

-- announce publishes "next:" on channel with publish (PUBLISH or SPUBLISH),
-- followed by the fair queue's head when the lock is free with a live queue
-- and the news is for the head alone (not anyone). A refused publish (an
-- ACL without the channel) does not undo what the script did.
local function announce(L, Q, QE, QO, publish, channel, anyone)
  local next = ''
  if not anyone and redis.call('EXISTS', L) == 0 and redis.call('EXISTS', Q) == 1 then
    pruneQueue(Q, QE, QO)
    next = redis.call('ZRANGE', Q, 0, 0)[1] or ''
  end
  redis.pcall(publish, channel, 'next:' .. next)
end
