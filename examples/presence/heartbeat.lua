-- heartbeat: mark a device online for a time to live.
-- KEYS[1] the device's key   KEYS[2] the known set   KEYS[3] the events stream
-- KEYS[4] highest sweeper fence accepted
-- ARGV[1] device id   ARGV[2] TTL in milliseconds   ARGV[3] stream length bound
-- Returns 1 when the device was not online (an "online" event was
-- appended), else 0.
--
-- A device whose key expired and that beats again before a sweep noticed
-- (an absence shorter than the time to the next sweep) is still in the
-- known set: its absence is announced here, "offline" then "online", in
-- the same step that ends it. The sweeper's offline.lua checks the key and
-- the set in one step too, so each absence is announced exactly once, by
-- whichever of the two runs first. The offline event carries the sweeper
-- fence accepted so far, so that fences along the stream never go back.
local existed = redis.call('EXISTS', KEYS[1])
redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then
  if existed == 1 then
    return 0
  end
  local fence = redis.call('GET', KEYS[4]) or '0'
  redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'device', ARGV[1], 'event', 'offline', 'fence', fence, 'by', 'heartbeat')
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'device', ARGV[1], 'event', 'online')
return 1
