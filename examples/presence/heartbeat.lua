-- heartbeat: mark a device online for a time to live.
-- KEYS[1] the device's key   KEYS[2] the known set   KEYS[3] the events stream
-- ARGV[1] device id   ARGV[2] TTL in milliseconds   ARGV[3] stream length bound
-- Returns 1 when the device was not in the known set (an "online" event was
-- appended), else 0.
redis.call('SET', KEYS[1], '1', 'PX', ARGV[2])
if redis.call('SADD', KEYS[2], ARGV[1]) == 0 then
  return 0
end
redis.call('XADD', KEYS[3], 'MAXLEN', '~', ARGV[3], '*', 'device', ARGV[1], 'event', 'online')
return 1
