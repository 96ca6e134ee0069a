-- release: drop one hold of a token, exclusive or shared, and the token's
-- writer intent and queue entry; wake waiters when that lets another in.
-- The fence counter is left alone on purpose. scripts.go puts queue.lua in
-- place of the line "--#queue" and common.lua in place of "--#common".
-- KEYS[1] lock hash   KEYS[2] shared holds   KEYS[3] shared holds' details
-- KEYS[4] writer intent   KEYS[5] fair queue   KEYS[6] fair queue's expiries
-- ARGV[1] token   ARGV[2] release channel
-- ARGV[3] the publish command: PUBLISH, or SPUBLISH on a Cluster; "" for
-- a release that wakes nobody (ReleaseQuietly)
-- KEYS[7] recent releases   KEYS[8] fair queue's owners   KEYS[9] fence
-- counter   ARGV[4] the request's id   ARGV[5] the fence of the grant the
-- release ends, or "" (or absent) when the caller does not say
-- KEYS[10] the late-request record (see late.lua, which scripts.go puts
-- in front of this script)
-- ARGV[6] (absent from clients before it) the ids, space-separated, of
-- the token's acquire requests that the client knows reached the server
-- once (go-redis wrote each once and read its grant), or ""
-- ARGV[7] (absent from clients before it) the ids, space-separated, of
-- the token's acquire requests of which a copy may still land (the client
-- never read an answer, or sent the request twice), or ""
-- ARGV[8] (absent from clients before it) "1" for a clean-up that takes
-- the entry of the token's successor out of the queue too
-- (driver.PlaceReleaser)
-- Returns -1 when the token held nothing, else the holds left.
--
-- A release that deletes an exclusive grant records the ids of the
-- requests that made it, but those ARGV[6] names (no copy of them
-- exists), and those of ARGV[7] (which may still land) whenever it
-- deletes the token's grant or finds it holding nothing; a release without
-- a fence (a clean-up after an acquire of
-- unknown outcome) that finds the token holding nothing records the token:
-- a copy of such a request that lands later is refused (acquire.lua), for
-- lateTTL.
--
-- A client may send the same request twice (go-redis resends a command
-- whose answer was lost with its connection, though it ran): the second
-- must answer as the first did. So the ids of recent releases are kept:
-- those that left holds in the hash ('rrid', the latest recentMax), those
-- that deleted the hash or a shared hold in KEYS[7] (the newest first, at
-- least recentKeep bytes of them: 16 ids as the Backend makes them), for
-- recentTTL ms after the latest; a request whose id is there changes
-- nothing and reports the holds the token has now.
--
-- The announcement is "next:" followed by the token at the head of the fair
-- queue when the lock is left free of an exclusive holder with a live
-- queue, else by nothing: any waiter may try. A released shared hold or a
-- removed intent is announced to any waiter. When the head accepts a
-- direct handoff and the lock lets it in, the release grants it the lock
-- (handOff in common.lua; a shared head, and the shared entries behind it
-- that the lock lets in, get shared holds) and announces each grant:
-- "next:" followed by the head, a NUL byte and the fence (and a NUL byte
-- and "s" when it queued the head's successor: queueSuccessor), on the
-- head's client's handoff channel NS:{K}:ho:ID:rel when its entry names one (see
-- acquire.lua's ARGV[13]), and, for an exclusive grant, on NS:{K}:ho:rel
-- too, for the clients observing the lock (driver.HandoffWatcher), else on
-- the release channel (publishGrants in queue.lua).
--
-- The last hold of a plain exclusive grant, without lock-delay, intent or
-- queue, is released before the helpers of the rest are even defined, and
-- one whose queue's head takes the lock by a direct handoff with only
-- queue.lua's.
local L, S, SI, W, Q, QE, R, QO, F, X = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9], KEYS[10]
local token, rid = ARGV[1], ARGV[4]
-- A clean-up: a release tied to no grant that wakes waiters. A quiet one
-- (ARGV[3] "") is Redlock's undo of one node's part of an attempt, whose
-- token the wait goes on using: it records no token.
local cleanup = (not ARGV[5] or ARGV[5] == '') and ARGV[3] ~= ''
local recentTTL, recentMax, recentBytes, recentKeep = 15000, 16, 640, 448

-- seen reports whether the space-separated ids ids include id.
local function seen(ids, id)
  return ids ~= nil and ids ~= false and string.find(' ' .. ids .. ' ', ' ' .. id .. ' ', 1, true) ~= nil
end

-- push returns ids with id in front, keeping recentMax of them.
local function push(ids, id)
  if not ids then
    return id
  end
  local out, n = {id}, 1
  for x in string.gmatch(ids, '%S+') do
    if n >= recentMax then
      break
    end
    n = n + 1
    out[n] = x
  end
  return table.concat(out, ' ')
end

-- done records that this request deleted the hash or a shared hold: its
-- id goes in front of the ids kept, which, once they pass recentBytes, are
-- cut between two ids after recentKeep bytes. That is one search for a
-- space where push parses every id and joins them again (push took most of
-- a release's time).
local function done(ids, rrid)
  local head = rid
  if rrid and rrid ~= '' then
    head = rid .. ' ' .. rrid -- the partial releases of the hold deleted
  end
  if not ids then
    ids = head
  elseif #ids < recentBytes then
    ids = head .. ' ' .. ids
  else
    local cut = string.find(ids, ' ', recentKeep, true)
    ids = cut and (head .. ' ' .. string.sub(ids, 1, cut - 1)) or head
  end
  redis.call('SET', R, ids, 'PX', string.format('%d', recentTTL))
end

-- One read of the hash gives the token's holds, the ids of the releases
-- that left holds, the lock-delay, which the fast path must not have, the
-- grant's fence and the ids of the requests that made it.
local h = redis.call('HMGET', L, token, 'rrid', 'delay', 'fence', 'rid')
local holds = h[1]
if holds and ARGV[5] and ARGV[5] ~= '' and h[4] ~= ARGV[5] then
  -- The token holds another grant than the one this release ends: the same
  -- owner ID or reentrant handle was granted the lock again since (this is
  -- a resend that arrived late, or a release of a grant already lost).
  -- That grant is not this release's to drop.
  holds = nil
end
-- The ids of the requests that made the grant, to record when it is
-- deleted: but those that the client says reached the server once.
local rids = h[5]
if ARGV[6] and ARGV[6] ~= '' and rids and rids ~= 'ho' then
  if rids == ARGV[6] then
    rids = nil
  else
    local left = {}
    for id in string.gmatch(rids, '%S+') do
      if not seen(ARGV[6], id) then
        left[#left + 1] = id
      end
    end
    rids = table.concat(left, ' ')
  end
end
-- members returns the record's members for the grant's requests rids
-- (served), with the requests of ARGV[7].
local function members(rids)
  local out = served(rids, token, cleanup)
  for id in string.gmatch(ARGV[7] or '', '%S+') do
    out[#out + 1] = 'r' .. id
  end
  return out
end
local recent = redis.call('GET', R)
if holds and seen(h[2], rid) then
  return tonumber(holds) -- a resent request: released already
end
if seen(recent, rid) then
  -- A resent request: it deleted the hold already (the token may hold
  -- again since: a grant to the same owner ID or reentrant handle).
  return 0 -- as the first run answered
end
-- EXISTS W Q Q X X X X L L L L L L L L, once read: EXISTS counts a key
-- named n times n times, so its answer % 4 is odd when W exists and 2 or
-- more when Q does (see leave), its answer % 8 is 4 or more when the
-- late-request record X does (whose pruning remember skips when X does
-- not: fresh), and it is 8 or more when the lock hash L does (which
-- handOff then need not look for: no path but a deleting one, which tells
-- handOff so, changes whether L exists).
local waiting, fresh, hasL
local function exists()
  local n = redis.call('EXISTS', W, Q, Q, X, X, X, X, L, L, L, L, L, L, L, L)
  hasL, n = n >= 8, n % 8
  fresh = n < 4
  return n % 4
end
if holds == '1' and not h[3] then
  waiting = exists()
end
if waiting == 0 then
  redis.call('DEL', L)
  done(recent, h[2])
  remember(X, members(rids), nil, fresh)
  if ARGV[3] ~= '' then
    redis.pcall(ARGV[3], ARGV[2], 'next:') -- refused (ACL): the release stands
  end
  return 0
end

--#queue
-- The handoff fast path: the release of an exclusive grant (without
-- lock-delay or writer intent) whose queue's head is live and takes a
-- direct handoff, as in a fair queue's steady state, hands the lock to the
-- head before the rest of common.lua is even defined. It makes the grant,
-- writes and publishes exactly what the rest of this script would, and,
-- when the head's client keeps its place in the queue, queues the head's
-- successor, which only this path does (queueSuccessor). pre is
-- what it read of the head, for handOff, when it made no grant.
local pre, both
if waiting == 2 and ARGV[3] ~= '' and #members(rids) == 0 and ARGV[8] ~= '1' then
  local head, exp, o, tail = headOf(Q, QE, QO, token)
  pre = {head = head, exp = exp, o = o, tail = tail}
  if o and o[1] and exp and exp > now() then
    redis.call('DEL', L)
    done(recent, h[2])
    local fence = grantHead(L, F, head, o[1], exp)
    if redis.call('ZREM', Q, head, token) == 1 then
      dropEntry(Q, QE, QO, head, tail) -- token had no entry
      local succ = queueSuccessor(Q, QE, QO, X, not fresh, head, o, exp)
      publishGrants({{head, fence, o[2], nil, succ}}, nil, ARGV[3], ARGV[2])
      return 0
    end
    both = {head, tail, fence, o, exp}
  end
end

--#common
if ARGV[8] == '1' then
  -- A clean-up of a token whose client kept its place in the queue: the
  -- place's successor goes in the same step, before the lock is handed on
  -- (see queueSuccessor), or nobody would take the lock that a release
  -- hands it.
  local succ = successor(token)
  if redis.call('ZREM', Q, succ) == 1 then
    dropEntry(Q, QE, QO, succ)
    waiting = nil -- EXISTS again: the queue may be gone
  end
end
if both then
  -- token had a queue entry too (see handOff).
  dropBoth(Q, QE, QO, both[1], token, both[2])
  local succ = queueSuccessor(Q, QE, QO, X, not fresh, both[1], both[4], both[5])
  publishGrants({{both[1], both[3], both[4][2], nil, succ}}, nil, ARGV[3], ARGV[2])
  return 0
end
local result = -1
local notify = false -- announce the release
local anyone = false -- announce it to every waiter, not only the queue's head
local freed = false  -- this release deleted an exclusive grant (see handOff)
local sfit = false   -- this release took a shared hold out: S and SI to fit

-- remember, once X is known to exist or not: a write makes it exist.
waiting = waiting or exists()
local function record(ms)
  if remember(X, ms, now(), fresh) then
    fresh = false
  end
end

if holds then
  local _, expired = leaseState(L, h[3])
  if expired then
    -- The lease expired and the lock sits in its lock-delay: the late
    -- holder is done with it, so the delay has no more reason to run.
    redis.call('DEL', L) -- not done(): a resend, too, finds nothing held
    record(members(rids))
    notify, freed = true, true
  else
    holds = tonumber(holds) - 1
    if holds > 0 then
      redis.call('HSET', L, token, int(holds), 'rrid', push(redis.call('HGET', L, 'rrid'), rid))
    else
      redis.call('DEL', L)
      done(recent, h[2])
      record(members(rids))
      notify, freed = true, true
    end
    result = holds
  end
else
  local exp = redis.call('ZSCORE', S, token)
  if exp then
    redis.call('ZREM', S, token)
    redis.call('HDEL', SI, token)
    sfit = true -- fit(S, SI) before the script ends, unless handOff does
    if tonumber(exp) > now() then
      -- Not for a hold that had expired: a resend, too, finds nothing
      -- held, and answers as this run does.
      done(recent)
      result, notify, anyone = 0, true, true
      -- A shared hold keeps no request ids: the client names those of its
      -- requests of which a copy may still land (a resent one).
      record(members(nil))
    end
  end
end

if result == -1 then
  -- Held nothing (or a lease that had expired): the acquire this cleans up
  -- after, or one whose answer was lost, may not have landed yet.
  local m = members(nil)
  if cleanup then
    m[#m + 1] = 't' .. token
  end
  record(m)
end

local waiters = waiting > 0
-- A release that deleted an exclusive grant announces it whatever leave
-- finds, and hands the lock over when it can: handOff takes token's queue
-- entry off then (deferred), most often with the head's in one ZREM.
local deferred = freed and waiting >= 2 and ARGV[3] ~= ''
local intent = false -- this release removed the token's writer intent
if waiters then
  local headLeft, _
  intent, _, headLeft = leave(L, S, W, Q, QE, QO, token, deferred and waiting % 2 or waiting)
  if intent then
    notify, anyone = true, true
  end
  if headLeft then
    notify = true -- the head gave up while the lock was free: the next may go
  end
end

local known -- handOff's word on the next, when it made no grant
if notify and waiters and ARGV[3] ~= '' then
  local given, next, blocked = handOff(L, F, S, SI, W, Q, QE, QO, freed, deferred and token, waiting % 2 == 0, hasL, deferred and pre)
  known = next
  if sfit and not (given[1] and given[1][4]) then
    fit(S, SI)
  end
  sfit = false
  if blocked and not intent then
    -- Nobody waiting can come in (the live shared holds keep out what
    -- they keep out the head from; a removed intent lets readers in that
    -- do not queue): the news would wake them for nothing.
    return result
  end
  if #given > 0 then
    publishGrants(given, next, ARGV[3], ARGV[2])
    return result
  end
end
if sfit then
  fit(S, SI)
end
if notify and ARGV[3] ~= '' then
  announce(L, Q, QE, QO, ARGV[3], ARGV[2], anyone or not waiters, known)
end
return result
