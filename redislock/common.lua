-- common: helpers of the scripts that handle shared holds, writer intents
-- and fair queues (acquire, renew, release, describe); scripts.go puts this
-- text, after queue.lua's, before theirs.
--
-- A lock's shared holds are a zset (token → expiry, ms by the server's
-- clock) and a hash of their details (token → "fence limit owner"); its
-- fair queue is a zset of expiries (token → expiry) and one of arrival
-- numbers (token → number). Each pair is written together and carries the
-- expiry of its latest entry, so it vanishes with it (the queue's keys:
-- that expiry or one up to a quarter of a QueueTTL later; see
-- stretchQueue in acquire.lua).

-- prune drops the entries of the expiry zset z that expired by now(), and
-- the same members of side with rem ('HDEL' for a hash, 'ZREM' for a zset),
-- and returns them.
local function prune(z, side, rem)
  local ms = int(now())
  local gone = redis.call('ZRANGEBYSCORE', z, '-inf', ms)
  if #gone == 0 then
    return gone
  end
  redis.call('ZREMRANGEBYSCORE', z, '-inf', ms)
  for i = 1, #gone, 1000 do -- unpack has a limit on its results
    redis.call(rem, side, unpack(gone, i, math.min(i + 999, #gone)))
  end
  return gone
end

-- fit gives the expiry zset z and its side the expiry of z's latest entry,
-- or deletes both when z is empty.
local function fit(z, side)
  local last = redis.call('ZRANGE', z, '-1', '-1', 'WITHSCORES')
  if #last == 0 then
    redis.call('DEL', z, side)
    return
  end
  redis.call('PEXPIREAT', z, last[2])
  redis.call('PEXPIREAT', side, last[2])
end

-- pruneQueue drops the queue's expired entries.
local function pruneQueue(Q, QE, QO)
  local gone = prune(QE, Q, 'ZREM')
  for i = 1, #gone, 300 do
    local fields = {}
    for j = i, math.min(i + 299, #gone) do
      fields[#fields + 1] = gone[j]
      fields[#fields + 1] = '\0' .. gone[j]
      fields[#fields + 1] = '\1' .. gone[j]
      fields[#fields + 1] = '\2' .. gone[j]
    end
    redis.call('HDEL', QO, unpack(fields))
  end
end

-- unqueue takes token's entry out of the queue; it reports whether it had
-- one. tail is as for dropEntry.
local function unqueue(Q, QE, QO, token, tail)
  if redis.call('ZREM', Q, token) == 0 then
    return false
  end
  dropEntry(Q, QE, QO, token, tail)
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

-- leaveQueue takes token's entry, which Q holds, off the queue, after
-- pruning it, and returns leave's second and third answers.
local function leaveQueue(L, S, Q, QE, QO, token)
  pruneQueue(Q, QE, QO)
  local head = redis.call('ZRANGE', Q, '0', '0')[1]
  if not unqueue(Q, QE, QO, token) then
    return false, false
  end
  if head ~= token or redis.call('EXISTS', L) == 1 then
    return true, false
  end
  if redis.call('ZCOUNT', S, string.format('(%d', now()), '+inf') == 0 then
    return true, true
  end
  -- Live shared holds: a shared entry now at the head may join them (the
  -- readers queued behind a writer that gave up), and so may an entry
  -- that takes no handoff (WithReplicaAck; its kind is not kept): all but
  -- an exclusive entry that takes a handoff, which they keep out.
  local next = redis.call('ZRANGE', Q, '0', '0')[1]
  return true, next ~= nil and redis.call('HEXISTS', QO, next) == 0
end

-- leave takes token's writer intent and fair queue entry off the lock (KEYS
-- as named in release.lua) and returns whether it had an intent (its going
-- concerns every waiter), whether it had an entry, and whether it was the
-- head of the queue and left the lock free, or left a shared entry at the
-- head beside live shared holds, so that the next may go. n,
-- when the caller has it, is the answer of EXISTS W Q Q (odd: W exists; 2
-- or more: Q exists): a missing key is not read.
local function leave(L, S, W, Q, QE, QO, token, n)
  local intent, entry, headLeft = false, false, false
  if (not n or n % 2 == 1) and redis.call('HGET', W, 't') == token then
    redis.call('DEL', W)
    intent = true
  end
  if (not n or n >= 2) and redis.call('ZSCORE', Q, token) then
    entry, headLeft = leaveQueue(L, S, Q, QE, QO, token)
  end
  return intent, entry, headLeft
end

-- dropBoth takes the entries of head and token, which ZREM Q head token
-- both took out of Q, out of QE and QO, as leaveQueue would have taken
-- token's off first, after pruning, and dropEntry then head's: the same
-- keys result. tail is as for dropEntry; head's entry is live, so QE's
-- latest is, and pruning leaves it the latest.
local function dropBoth(Q, QE, QO, head, token, tail)
  local last = tail[#tail - 1]
  pruneQueue(Q, QE, QO)
  redis.call('ZREM', QE, head, token)
  redis.call('HDEL', QO, head, '\0' .. head, '\1' .. head, '\2' .. head, token, '\0' .. token, '\1' .. token, '\2' .. token)
  if last == nil or last == head or last == token then
    fitQueue(Q, QE, QO)
  end
end

-- handBatch is the most shared holds one release hands over.
local handBatch = 100

-- smallLimit is the most live shared holds that a script reads as a whole
-- (their count, ends and members in one command) rather than count them
-- and read their ends one by one: semaphores' permits, a few readers.
local smallLimit = 16

-- handOff grants the lock to the live head of the fair queue when the
-- head's request accepts a direct handoff (it has an owner in QO) and the
-- lock lets it in: an exclusive head when the lock is free of exclusive
-- and live shared holds; a shared head (a reader, a permit) when it is
-- free of an exclusive hold and of a live writer intent of a token that is
-- not queued (a queued writer waits its turn in the queue), and its live
-- shared holds are of the head's limit and, with a limit, fewer than it.
-- After a shared head it goes on with the entries behind it while they are
-- shared ones that the lock lets in (the readers queued behind a writer,
-- the permits a release frees), up to handBatch of them.
-- An exclusive grant is marked 'ho' (its rid) until the head's next
-- request claims it; its key, and a shared hold, expire with the head's
-- entry (the head's last request + its QueueTTL), so that a head that died
-- leaves the lock no later than its entry would have; the head's next
-- request finds its hold and gives it its TTL (acquire.lua).
-- It returns the grants made, in queue order, each {token, fence, id of
-- the token's client's handoff channel or false, true for a shared hold
-- (then handOff has fitted S and SI)}, and what announce would
-- find as the next: with no grant, the lock being free, the live head that
-- a prune leaves the head, or '' when the queue is gone, or nil when it did
-- not look or found a head that is not live; after handBatch grants, the
-- next head, which may come in too, and after shared grants, a live head
-- that takes no handoff (it asks in turn). Its third answer is true when it
-- made no grant because the head, live and accepting a handoff, waits for live
-- shared holds (of another limit, or as many as its limit; or readers,
-- for a writer): those keep out the fair waiters behind it, and plain
-- ones while a writer's intent stands (a release that takes an intent off
-- announces it all the same: release.lua), and a release of the last of
-- them hands the lock over. freed is true when the caller has just
-- deleted an exclusive grant: then the lock is free of live shared holds
-- too, with no need to look (no shared hold is granted or renewed while an
-- exclusive grant exists, and an exclusive grant is made only when no
-- shared hold is live).
-- token, when given, is a token whose queue entry the caller left for
-- handOff to take off as leave would have first (leaveQueue): with the
-- head's, in one ZREM, when the head is another token and gets the lock.
-- noW is true when the caller knows that there is no writer intent;
-- hasL, when not nil, whether the lock hash exists. pre, when given, is
-- what headOf(Q, QE, QO, token) read (as {head, exp, o, tail}), with no
-- write to the queue since.
local function handOff(L, F, S, SI, W, Q, QE, QO, freed, token, noW, hasL, pre)
  if hasL == nil and not freed then
    hasL = redis.call('EXISTS', L) == 1
  end
  if not freed and hasL then
    return {}
  end
  local head, exp, o, tail
  if pre then
    head, exp, o, tail = pre.head, pre.exp, pre.o, pre.tail
  else
    head, exp, o, tail = headOf(Q, QE, QO, token)
  end
  if token and not (o and o[1] and exp and exp > now()) then
    -- No exclusive grant to make with what was read: token's entry goes
    -- first.
    if head and (head == token or redis.call('ZSCORE', Q, token)) then
      leaveQueue(L, S, Q, QE, QO, token)
      head, exp, o, tail = headOf(Q, QE, QO)
    end
    token = nil
  end
  if not head then
    return {}, ''
  end
  -- The queue is pruned only when its head's entry has expired: pruning
  -- takes a command every time, and every enqueue prunes anyway.
  if not exp or exp <= now() then
    pruneQueue(Q, QE, QO)
    head, exp, o, tail = headOf(Q, QE, QO)
    if not head then
      return {}, ''
    end
    if not exp or exp <= now() then
      return {}
    end
  end
  if not o[1] and not o[3] then
    return {}, head
  end
  -- The live shared holds, their limit, and the latest expiry among them
  -- and the holds handed below, for S and SI to expire with (as fit would
  -- read it: the holds that expired are earlier still).
  local n, held, latest = 0, -1, 0
  if not freed then
    local since = string.format('(%d', now())
    local live = redis.call('ZRANGEBYSCORE', S, since, '+inf', 'WITHSCORES', 'LIMIT', '0', int(smallLimit + 1))
    local last
    if #live <= 2 * smallLimit then
      n = #live / 2
      last = live[#live - 1]
      latest = tonumber(live[#live]) or 0
    else
      n = redis.call('ZCOUNT', S, since, '+inf')
      local l = redis.call('ZRANGE', S, '-1', '-1', 'WITHSCORES')
      last, latest = l[1], tonumber(l[2])
    end
    if n > 0 then
      local _
      _, held = holdDetails(redis.call('HGET', SI, last))
    end
  end
  -- fitHolds gives S and SI the expiry of their latest hold, after the
  -- grants below (which made S non-empty): latest, unless a grant moved a
  -- hold that S had already (its token's own, whose old expiry latest may
  -- be), when fit reads it.
  local moved = false
  local function fitHolds()
    if moved then
      fit(S, SI)
      return
    end
    local at = int(latest)
    redis.call('PEXPIREAT', S, at)
    redis.call('PEXPIREAT', SI, at)
  end
  if o[1] then
    if n > 0 then
      return {}, nil, true
    end
    local hid = o[2]
    local fence = grantHead(L, F, head, o[1], exp)
    if not noW and redis.call('HGET', W, 't') == head then
      -- The head's wait ends: its writer intent goes, as a grant to its
      -- request takes it (acquire.lua's forget).
      redis.call('DEL', W)
    end
    if not token then
      unqueue(Q, QE, QO, head, tail)
    elseif redis.call('ZREM', Q, head, token) == 1 then
      dropEntry(Q, QE, QO, head, tail) -- token had no entry
    else
      dropBoth(Q, QE, QO, head, token, tail)
    end
    return {{head, fence, hid}}
  end
  local given, writer = {}, nil
  while true do
    local limit, owner = string.match(o[3], '^(%d+) (.*)$')
    limit = tonumber(limit) or 0
    if (n > 0 and held ~= limit) or (limit > 0 and n >= limit) then
      if #given == 0 then
        return given, nil, true
      end
      break
    end
    if writer == nil then
      writer = not noW and redis.call('HGET', W, 't')
      if writer and redis.call('ZSCORE', Q, writer) then
        writer = false
      end
    end
    if writer then
      break
    end
    local fence = redis.call('INCR', F)
    if redis.call('ZADD', S, int(exp), head) == 0 then
      moved = true
    end
    latest = math.max(latest, exp)
    redis.call('HSET', SI, head, string.format('%d %d ', fence, limit) .. owner)
    unqueue(Q, QE, QO, head, tail)
    n, held = n + 1, limit
    given[#given + 1] = {head, fence, o[2], true}
    if limit > 0 and n >= limit then
      break -- no permit left for the next
    end
    head, exp, o, tail = headOf(Q, QE, QO)
    if head and (not exp or exp <= now()) then
      pruneQueue(Q, QE, QO)
      head, exp, o, tail = headOf(Q, QE, QO)
    end
    if head and exp and exp > now() and not o[1] and not o[3] then
      -- A live entry that takes no handoff (WithReplicaAck): it is named
      -- as the next, as it would be with no grant made, to ask.
      fitHolds()
      return given, head
    end
    if head and exp and exp > now() and o[1] and not o[3] and (noW or redis.call('EXISTS', W) == 0) then
      -- The next head is a writer that now waits for the holds just
      -- handed, with no writer intent when it queued behind an exclusive
      -- grant (which records none): it gets the intent its next request
      -- would record, for as long as its entry lives, so that plain
      -- readers do not come in before it meanwhile.
      redis.call('HSET', W, 't', head, 'o', o[1])
      redis.call('PEXPIREAT', W, int(exp))
    end
    if not head or not exp or exp <= now() or not o[3] then
      break
    end
    if #given >= handBatch then
      fitHolds()
      return given, head
    end
  end
  if #given > 0 then
    fitHolds()
  end
  return given
end

-- announce publishes "next:" on channel with publish (PUBLISH or SPUBLISH),
-- followed by the fair queue's head when the lock is free with a live queue
-- and the news is for the head alone (not anyone). A refused publish (an
-- ACL without the channel) does not undo what the script did. known is
-- handOff's second answer, when the caller has it: the head, which the
-- prune leaves in place, or '' for no queue, with the lock free.
local function announce(L, Q, QE, QO, publish, channel, anyone, known)
  local next = ''
  if not anyone and known then
    if known ~= '' then
      pruneQueue(Q, QE, QO)
      next = known
    end
  elseif not anyone and redis.call('EXISTS', L) == 0 and redis.call('EXISTS', Q) == 1 then
    pruneQueue(Q, QE, QO)
    next = redis.call('ZRANGE', Q, '0', '0')[1] or ''
  end
  redis.pcall(publish, channel, 'next:' .. next)
end
