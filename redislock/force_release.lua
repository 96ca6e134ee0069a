-- force_release (after describe.lua): delete the lock's exclusive hold and
-- every shared hold whoever holds them, wake every waiter and describe what
-- was removed. Writer intents, the fair queue and the fence counter are
-- left alone on purpose.
-- ARGV[1] release channel   ARGV[2] the publish command: PUBLISH, or SPUBLISH on a Cluster
-- Returns describe()'s answer, or nil when the lock was not held.
local info = describe()
if not info then
  return false
end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3])
redis.pcall(ARGV[2], ARGV[1], 'next:') -- refused (ACL): the release stands
return info
