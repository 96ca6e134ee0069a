-- acquire: grant the lock to a token, exclusively or as a shared hold, or
-- report why not, recording a waiter's intent or queue entry. scripts.go
-- puts common.lua in place of the line "--#common".
-- KEYS[1] lock hash   KEYS[2] fence counter   KEYS[3] shared holds (zset)
-- KEYS[4] shared holds' details   KEYS[5] writer intent   KEYS[6] fair queue
-- KEYS[7] fair queue's expiries   KEYS[8] fair queue's owners
-- ARGV[1] token   ARGV[2] owner   ARGV[3] ttl in ms   ARGV[4] "1" when reentrant
-- ARGV[5] lock-delay in ms ("0": none)   ARGV[6] "1" for a shared hold
-- ARGV[7] limit of shared holds ("0": none)   ARGV[8] "1" when fair
-- ARGV[9] "1" when the caller waits   ARGV[10] queue ttl in ms
-- ARGV[11] the request's id   ARGV[12] "1" when a release may hand the lock
-- to the token as the queue's head (a direct handoff; see handOff)
-- ARGV[13] (absent from clients before it) the id of the client's handoff
-- channel: a release that hands the lock to this token's queue entry
-- publishes on NS:{K}:ho:ID:rel, which the client alone hears, instead of
-- on the release channel that every waiting client hears
-- KEYS[9] the late-request record (see late.lua)
-- ARGV[14], ARGV[15] (absent from clients before them) the release channel
-- and the publish command (PUBLISH, or SPUBLISH on a Cluster): a fair
-- shared grant hands holds to the shared entries queued behind it that the
-- lock lets in, and announces them as a release does (publishGrants)
-- ARGV[16] (absent from clients before it) "1" when the token's client keeps
-- its place in the queue (driver.AcquireRequest.KeepPlace): a release that
-- hands the lock to this entry queues its successor (queueSuccessor in
-- queue.lua); "0" when not
-- Returns {1, fence, holds} when granted, or {1, fence, holds, overtook}
-- where overtook is 1 when a grant without fair went before a live fair
-- queue's head; when not, {0, holder owner,
-- holder pttl} or {0, holder owner, holder pttl, live shared holds,
-- 1 when a writer intent refused it, position in the queue, 1 when queued}
-- or, for a request that accepts a handoff, the same followed by the fence
-- counter; with ARGV[13], a refusal of an exclusive request that waits, or
-- of a shared one without fair that waits, has nine: the fence counter (0
-- for a request that accepts no handoff) and 1 when the lock has a live
-- fair queue (which a plain waiter then joins: it no longer hears the
-- handoffs to other clients); a new shared hold is {1, fence, 1, overtook};
-- for a shared request
-- whose limit is not the one of the live shared holds (a conflict), {2, an
-- owner of those holds, its pttl, live shared holds, their limit}.
--
-- With a lock-delay the hash also keeps 'delay' and lives delay ms past the
-- lease: in between, the lock is expired but nobody may take it (see
-- leaseState in common.lua; grants of earlier versions also kept 'exp').
--
-- A client may send the same request twice (go-redis resends a command
-- whose answer was lost with its connection, though it ran): the second
-- must answer as the first did. An exclusive grant keeps the ids of the
-- requests that made it or entered it again ('rid', the latest few), and
-- a request whose id is there gets the grant back unchanged. A shared hold
-- is always its request's alone (the client draws a token per request), so
-- a request that finds its token's hold gets it back.
--
-- A request that lands late, after its caller gave up and cleaned up, must
-- grant nothing and queue nothing: a request whose id the late-request
-- record holds (its grant was released since: this is a copy that
-- go-redis sent first and the network delivered last) or whose token it
-- holds (released by a clean-up while it held nothing) is refused, with
-- {0, '', ms until the record lets it in}, before anything is written;
-- one whose token was withdrawn from the queue is refused a queue entry
-- and a writer intent. release.lua and withdraw.lua write the record
-- (late.lua).
--
-- A lock that is free of everything (no lock hash, no shared holds, no
-- intent, no queue) is granted at once, before the helpers of the rest are
-- even defined: the plain uncontended grant costs one EXISTS (and, while
-- the late-request record exists, its two ZSCOREs).
local L, F, S, SI, W, Q, QE, QO, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local token, owner, ttl, rid = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[11] or ''
local shared = ARGV[6] == '1'

-- grant makes a new exclusive grant, acquired at at (ms, a decimal
-- string), and returns its answer. Its arguments to Redis are strings where
-- they can be: Lua formats a number it passes with printf's %.14g.
local function grant(at)
  local fence = redis.call('INCR', F)
  local delay = tonumber(ARGV[5]) or 0
  if delay > 0 then
    redis.call('HSET', L, token, '1', 'owner', owner, 'fence', string.format('%d', fence), 'at', at, 'rid', rid, 'delay', ARGV[5])
    redis.call('PEXPIRE', L, string.format('%d', ttl + delay))
  else
    redis.call('HSET', L, token, '1', 'owner', owner, 'fence', string.format('%d', fence), 'at', at, 'rid', rid)
    redis.call('PEXPIRE', L, ARGV[3])
  end
  return {1, fence, 1}
end

-- The fast path: one EXISTS decides that the lock is free of everything,
-- and the grant is made as the end of this script would make it. EXISTS
-- counts a key named n times n times, so naming L once, S twice, W four
-- times, Q eight times and X sixteen times makes its answer tell which of
-- them exist, for the rest of the script: the late-request record is read
-- only when it exists (a queue's steady state, whose handed grants record
-- nothing, has none). A shared request goes past the fast path.
local hasL, hasS, hasW, hasQ, hasX
local n = redis.call('EXISTS', L, S, S, W, W, W, W, Q, Q, Q, Q, Q, Q, Q, Q,
  X, X, X, X, X, X, X, X, X, X, X, X, X, X, X, X)
hasX, n = n >= 16, n % 16
hasL, hasS, hasW, hasQ = n % 2 == 1, n % 4 >= 2, n % 8 >= 4, n >= 8
if hasX ~= false then
  local till = math.max(tonumber(redis.call('ZSCORE', X, 'r' .. rid)) or 0,
    tonumber(redis.call('ZSCORE', X, 't' .. token)) or 0)
  if till > 0 then
    local t = redis.call('TIME')
    local left = till - (tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000))
    if left > 0 then
      return {0, '', left}
    end
  end
end
if n == 0 and not shared then
  local t = redis.call('TIME')
  return grant(string.format('%s%03d', t[1], math.floor(tonumber(t[2]) / 1000)))
end

--#common
local fair = ARGV[8] == '1'
local hid = ARGV[13] -- nil from clients before the handoff channel
local overtook = 0
local qttl = tonumber(ARGV[10] or '0') or 0
local wait = ARGV[9] == '1' and qttl > 0
if wait and hasX ~= false then
  -- Withdrawn (late.lua): a request of token still on its way when its
  -- caller left the queue; it may be granted, but it leaves nothing behind.
  local till = tonumber(redis.call('ZSCORE', X, 'w' .. token))
  if till and till > now() then
    wait = false
  end
end

-- busy answers a request that the exclusive grant in L refuses; owner is
-- its owner when the caller read it already (false when absent).
local function busy(owner)
  if owner == nil then
    owner = redis.call('HGET', L, 'owner')
  end
  return {0, owner or '', redis.call('PTTL', L)}
end

-- stretchQueue keeps the queue's keys from expiring before their latest
-- entry, or more than a quarter of qttl after it, once an entry that
-- expires at exp is written. k is the key whose expiry the three share
-- (QO when the write went to it: it may have created it; else QE); fresh
-- is true when the write created Q and QE. Keys that expire between an
-- eighth and a quarter of qttl after exp are left as they are (one PTTL,
-- where fitQueue's writes take four commands); else they get the latest
-- entry's expiry plus a quarter of qttl.
local function stretchQueue(k, exp, fresh)
  local slack = math.floor(qttl / 4)
  local p, last = -1, exp
  if not fresh then
    p = redis.call('PTTL', k) -- -1 for a key that the write created
    if p > qttl + slack / 2 and p <= qttl + slack then
      return
    end
    last = tonumber(redis.call('ZRANGE', QE, '-1', '-1', 'WITHSCORES')[2]) or exp
  end
  local at = math.max(last, exp) + slack
  if p > qttl + slack and now() + p <= at then
    return -- they outlive exp by more, as an entry expires later
  end
  at = string.format('%d', at)
  redis.call('PEXPIREAT', QE, at)
  redis.call('PEXPIREAT', Q, at)
  redis.call('PEXPIREAT', QO, at)
end

-- enqueue puts token at the tail of the fair queue, or keeps its place,
-- with an expiry of now + qttl, and returns its place (1 is the head).
local function enqueue()
  pruneQueue(Q, QE, QO)
  local exp = now() + qttl
  -- ZADD answers 1 when token is new to QE: Q and QE hold the same
  -- tokens, so it is new to Q too, and takes the tail's number + 1.
  -- fresh: Q was empty, so this write created Q and QE, whatever QO's
  -- expiry says (a client before the handoff channel leaves fields of
  -- gone entries in QO).
  local fresh = false
  if redis.call('ZADD', QE, int(exp), token) == 1 then
    local last = redis.call('ZRANGE', Q, '-1', '-1', 'WITHSCORES')
    redis.call('ZADD', Q, 'NX', int((tonumber(last[2]) or 0) + 1), token)
    fresh = #last == 0
  end
  local k = QE
  if ARGV[12] == '1' then
    -- A shared entry keeps its owner under a field of its own (see
    -- common.lua), with its limit.
    local f, v = token, owner
    if shared then
      f, v = '\1' .. token, (ARGV[7] or '0') .. ' ' .. owner
    end
    if ARGV[16] and ARGV[16] ~= '' and not shared then
      -- The entry's time to live when a release is to queue its successor,
      -- or "0" for none (see queueSuccessor).
      local keep = ARGV[16] == '1' and ARGV[10] or '0'
      if hid and hid ~= '' then
        redis.call('HSET', QO, f, v, '\0' .. token, hid, '\2' .. token, keep)
      else
        redis.call('HSET', QO, f, v, '\2' .. token, keep)
      end
    elseif hid and hid ~= '' then
      redis.call('HSET', QO, f, v, '\0' .. token, hid)
    else
      redis.call('HSET', QO, f, v)
    end
    k = QO
  end
  stretchQueue(k, exp, fresh)
  local rank = redis.call('ZRANK', Q, token)
  if not rank then -- QE kept token while Q did not (no script does that)
    local last = redis.call('ZRANGE', Q, '-1', '-1', 'WITHSCORES')
    redis.call('ZADD', Q, int((tonumber(last[2]) or 0) + 1), token)
    fitQueue(Q, QE, QO)
    rank = redis.call('ZRANK', Q, token)
  end
  return rank + 1
end

-- refuse answers a refused request: with wait, it records a writer intent
-- when shared holds refused an exclusive request (unless another token's
-- intent is live), renews the token's own intent whatever refused it, and,
-- with fair, records or keeps a queue entry. fence is the fence of the
-- exclusive grant that refused it, when the caller read it; byIntent is 1
-- when a writer intent refused a shared request.
local function refuse(holder, pttl, nshared, byShared, fence, byIntent)
  local position, queued = 0, 0
  if wait and not shared then
    local writer = hasW and redis.call('HGET', W, 't')
    if writer == token or (byShared and not writer) then
      -- A waiting writer keeps its intent whatever refuses it now (another
      -- writer may hold the lock between the readers and this one).
      redis.call('HSET', W, 't', token, 'o', owner)
      redis.call('PEXPIRE', W, int(qttl))
      queued = 1
    end
  end
  if wait and fair then
    position, queued = enqueue(), 1
  end
  local counter = 0
  if ARGV[12] == '1' then
    -- While an exclusive grant lives nothing else draws a fence, so its
    -- fence (when the caller read it) is the counter.
    counter = tonumber(fence or redis.call('GET', F) or '0')
  end
  if hid ~= nil and ARGV[9] == '1' then
    local live = 0
    if not fair and hasQ then
      -- Q expires with its latest entry or up to a quarter of a QueueTTL
      -- after it (see stretchQueue; it is not pruned on this path).
      live = 1
    end
    return {0, holder, pttl, nshared, byIntent or 0, position, queued, counter, live}
  end
  if ARGV[12] == '1' then
    return {0, holder, pttl, nshared, byIntent or 0, position, queued, counter}
  end
  return {0, holder, pttl, nshared, byIntent or 0, position, queued}
end

-- forget drops token's writer intent and queue entry, after a grant (the
-- keys that the fast path's EXISTS found missing are not read again).
local function forget()
  if hasW ~= false and redis.call('HGET', W, 't') == token then
    redis.call('DEL', W)
  end
  if hasQ ~= false then
    unqueue(Q, QE, QO, token)
  end
end

if shared then
  -- refuseShared answers a refused shared request: a fair one through
  -- refuse, which queues it when it waits; another as clients before fair
  -- shared requests read. byIntent is 1 when a writer intent refused it.
  local function refuseShared(holder, pttl, n, byIntent)
    if fair then
      return refuse(holder, pttl, n, false, nil, byIntent)
    end
    if hid ~= nil and wait then
      -- As refuse answers a plain exclusive request that waits: whether
      -- the lock has a live fair queue, which a starving waiter joins.
      return {0, holder, pttl, n, byIntent or 0, 0, 0, 0, hasQ and 1 or 0}
    end
    return {0, holder, pttl, n, byIntent or 0, 0, 0}
  end
  if hasL then
    return refuseShared(redis.call('HGET', L, 'owner') or '', redis.call('PTTL', L), 0)
  end
  local limit = tonumber(ARGV[7]) or 0
  -- n live holds; mine, the token's own hold's expiry; first and last, the
  -- holds that expire first and last ({member, expiry}), once read. With a
  -- small limit (a semaphore's permits) one ZRANGE of up to limit + 1
  -- holds, after the prune, reads all of them when they are no more than
  -- the limit: the count, the token's hold and both ends, where ZCARD,
  -- ZSCORE and two ZRANGEs would read them one by one.
  local n, mine, first, last = 0, nil, nil, nil
  if hasS then
    prune(S, SI, 'HDEL')
    local all = limit > 0 and limit <= smallLimit and redis.call('ZRANGE', S, '0', int(limit), 'WITHSCORES')
    if all and #all <= 2 * limit then
      n = #all / 2
      for i = 1, #all, 2 do
        if all[i] == token then
          mine = all[i + 1]
        end
      end
      if n > 0 then
        first, last = {all[1], all[2]}, {all[#all - 1], all[#all]}
      end
    else
      n = redis.call('ZCARD', S)
      mine = redis.call('ZSCORE', S, token)
    end
  end
  if mine then
    -- This request's own hold (pruned above if it expired): it was resent,
    -- or a release handed it to the token (handOff), and this request
    -- claims it: it gets the request's TTL, whether the request is fair or
    -- not (a plain waiter in the queue may claim it with a plain request:
    -- waiter.fairNext), as the client trusts the grant for that TTL; a
    -- handed hold lives only as long as the token's queue entry.
    local fence = holdDetails(redis.call('HGET', SI, token))
    if tonumber(mine) < now() + ttl then
      redis.call('ZADD', S, int(now() + ttl), token)
      fit(S, SI)
    end
    if fair then
      forget()
    end
    return {1, fence, 1}
  end
  -- The details of the first hold, when the request is at the limit and
  -- the holds were read (HMGET with the last's; see below).
  local firstDetails
  if n > 0 then
    -- The live holds bind the name's kind and limit (readers: 0): a
    -- request of another is refused whatever else holds the lock.
    local lastDetails
    if not last then
      last = redis.call('ZRANGE', S, '-1', '-1', 'WITHSCORES')
      lastDetails = redis.call('HGET', SI, last[1])
    elseif n >= limit then
      local d = redis.call('HMGET', SI, last[1], first[1])
      lastDetails, firstDetails = d[1], d[2]
    else
      lastDetails = redis.call('HGET', SI, last[1])
    end
    local _, held, holder = holdDetails(lastDetails)
    if held ~= limit then
      return {2, holder, tonumber(last[2]) - now(), n, held}
    end
  end
  local writer = hasW and redis.call('HMGET', W, 't', 'o') or {false, false}
  if writer[1] and writer[1] ~= token and not (fair and redis.call('ZSCORE', Q, writer[1])) then
    -- A writer intent keeps new readers out, but that of a queued writer
    -- keeps out only requests without fair: the queue orders the others.
    return refuseShared(writer[2] or '', redis.call('PTTL', W), n, 1)
  end
  if limit > 0 and n >= limit then
    -- At the limit: wait for the hold that expires first.
    if not first then
      first = redis.call('ZRANGE', S, '0', '0', 'WITHSCORES')
      firstDetails = redis.call('HGET', SI, first[1])
    end
    local _, _, holder = holdDetails(firstDetails)
    return refuseShared(holder, tonumber(first[2]) - now(), n)
  end
  if hasQ then
    pruneQueue(Q, QE, QO)
    local head = redis.call('ZRANGE', Q, '0', '0')[1]
    if head and head ~= token then
      if fair then
        if writer[1] and writer[1] ~= token then
          -- A queued writer's intent stands: the writer goes first, once
          -- the holds go, as a plain intent refuses (the waiter must not
          -- take the lock as promised to a head that does not come).
          return refuseShared(writer[2] or '', redis.call('PTTL', W), n, 1)
        end
        if n > 0 then
          local w = redis.call('HGET', QO, head)
          if w then
            -- The head is a writer that waits for the shared holds to go
            -- and has no intent yet (another's stood, or lapsed, at its
            -- last request): it goes first, as its intent would refuse,
            -- and is named until its entry lapses.
            return refuseShared(w, tonumber(redis.call('ZSCORE', QE, head)) - now(), n, 1)
          end
        end
        -- A live entry of another goes first: the lock is free for this
        -- request, but promised to the head (one whose kind the queue does
        -- not keep, an entry that takes no handoff, is taken for free).
        return refuseShared('', -2, n)
      end
      overtook = 1
    end
  end
  local fence = redis.call('INCR', F)
  redis.call('ZADD', S, int(now() + ttl), token)
  redis.call('HSET', SI, token, string.format('%d %d ', fence, limit) .. owner)
  fit(S, SI)
  forget()
  if fair and hasQ and ARGV[14] and ARGV[14] ~= '' then
    -- The shared entries queued behind this request, which the lock lets in
    -- beside it, are handed holds as a release would (the lock came free
    -- without one: a lease that lapsed, a release of an older client).
    local given, next = handOff(L, F, S, SI, W, Q, QE, QO, false, nil, not hasW, false)
    if #given > 0 then
      publishGrants(given, next, ARGV[15], ARGV[14])
    elseif next and next ~= '' then
      -- The next head takes no handoff (WithReplicaAck): it is woken to
      -- ask, as a release names it.
      redis.pcall(ARGV[15], ARGV[14], 'next:' .. next)
    end
  end
  return {1, fence, 1, overtook}
end

-- One read of the hash: the lock-delay, the token's holds, the ids of the
-- requests that made the grant, its fence and its owner.
local hm = redis.call('HMGET', L, 'delay', token, 'rid', 'fence', 'owner')
local delay, expired = leaseState(L, hm[1])
if expired then
  local r = busy(hm[5]) -- expired, kept out of reach for its lock-delay
  return refuse(r[2], r[3], 0, false, hm[4])
end
local holds = hm[2]
if holds then
  local rids = hm[3] or ''
  if string.find(' ' .. rids .. ' ', ' ' .. rid .. ' ', 1, true) then
    return {1, hm[4], tonumber(holds)} -- resent
  end
  if rids == 'ho' then
    -- A release handed the lock to this token (handOff); its request
    -- claims the grant, which gets the request's TTL.
    redis.call('HSET', L, 'rid', rid)
    if redis.call('PTTL', L) < ttl then
      redis.call('PEXPIRE', L, int(ttl))
    end
    return {1, hm[4], tonumber(holds)}
  end
  if ARGV[4] ~= '1' then
    local r = busy(hm[5])
    return refuse(r[2], r[3], 0, false, hm[4])
  end
  holds = redis.call('HINCRBY', L, token, '1')
  local keep = {rid}
  for x in string.gmatch(rids, '%S+') do
    if #keep >= 16 then
      break
    end
    keep[#keep + 1] = x
  end
  redis.call('HSET', L, 'rid', table.concat(keep, ' '))
  if redis.call('PTTL', L) < ttl + delay then
    redis.call('PEXPIRE', L, int(ttl + delay)) -- extend, never shorten
  end
  return {1, hm[4], holds}
end
if hasL then
  local r = busy(hm[5])
  return refuse(r[2], r[3], 0, false, hm[4])
end
if hasS or hasW or hasQ then
  if hasS then
    prune(S, SI, 'HDEL')
    local n = redis.call('ZCARD', S)
    if n > 0 then
      -- Wait for the shared hold that expires last.
      local last = redis.call('ZRANGE', S, '-1', '-1', 'WITHSCORES')
      local _, _, holder = holdDetails(redis.call('HGET', SI, last[1]))
      return refuse(holder, tonumber(last[2]) - now(), n, true)
    end
  end
  if hasQ then
    pruneQueue(Q, QE, QO)
    local head = redis.call('ZRANGE', Q, '0', '0')[1]
    if head and head ~= token then
      if fair then
        return refuse('', -2, 0, false) -- free, but promised to the head
      end
      overtook = 1
    end
  end
  forget()
end
local r = grant(string.format('%d', now()))
r[4] = overtook
return r
