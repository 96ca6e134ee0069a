-- break_if: delete the lock's exclusive hold if its grant's fence is ARGV[1]
-- and it has no lock-delay, and wake every waiter (driver.Breaker).
-- Shared holds, the fair queue, a writer intent and the fence counter stay.
-- KEYS[1] the lock hash
-- ARGV[1] fence (decimal)   ARGV[2] release channel   ARGV[3] PUBLISH or SPUBLISH
-- Returns 1 when it broke the hold, else 0.
if redis.call('HGET', KEYS[1], 'fence') ~= ARGV[1] then
  return 0
end
if redis.call('HEXISTS', KEYS[1], 'delay') == 1 then
  return 0 -- a lock-delay keeps the lock from others after a crash: kept
end
redis.call('DEL', KEYS[1])
redis.pcall(ARGV[3], ARGV[2], 'next:') -- refused (ACL): the break stands
return 1
