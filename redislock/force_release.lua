-- force_release (after describe.lua): delete the lock KEYS[1] whoever holds
-- it, wake waiters and describe what was removed. The fence counter is left
-- alone on purpose.
-- ARGV[1] release channel   ARGV[2] the publish command: PUBLISH, or SPUBLISH on a Cluster
-- Returns describe()'s answer, or nil when the lock was not held.
local info = describe()
if not info then
  return false
end
redis.call('DEL', KEYS[1])
redis.call(ARGV[2], ARGV[1], KEYS[1])
return info
