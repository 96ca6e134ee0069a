-- offline: publish "went offline" for a device whose heartbeat key is gone,
-- once, and only for the current sweeper.
-- KEYS[1] highest sweeper fence accepted   KEYS[2] the known set
-- KEYS[3] the device's key                  KEYS[4] the events stream
-- ARGV[1] the sweeper's fence (decimal)   ARGV[2] device id
-- ARGV[3] stream length bound
-- Returns -1 when a newer sweeper has written (stale fence), 1 when the event
-- was appended, 0 when there was nothing to do (the device is back online,
-- or it was already announced offline).
-- Fences are compared as decimal strings (length, then bytes): Lua numbers
-- are doubles and lose precision past 2^53.
local function older(a, b)
  if #a ~= #b then
    return #a < #b
  end
  return a < b
end
local accepted = redis.call('GET', KEYS[1])
if accepted and older(ARGV[1], accepted) then
  return -1
end
if accepted ~= ARGV[1] then
  redis.call('SET', KEYS[1], ARGV[1])
end
if redis.call('EXISTS', KEYS[3]) == 1 then
  return 0
end
if redis.call('SREM', KEYS[2], ARGV[2]) == 0 then
  return 0
end
redis.call('XADD', KEYS[4], 'MAXLEN', '~', ARGV[3], '*', 'device', ARGV[2], 'event', 'offline', 'fence', ARGV[1])
return 1
