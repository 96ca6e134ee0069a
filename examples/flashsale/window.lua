-- window: one hit on a client's fixed-window counter.
-- KEYS[1] the client's counter for the current window
-- ARGV[1] the window, in milliseconds
-- The first hit of a window creates the counter and sets its expiry in the
-- same step, so no counter is ever left without one (a crash between a
-- separate INCR and EXPIRE would block the client for good). Later hits
-- leave the expiry alone: the window ends where its first hit put it.
-- Returns the hits counted in the window, this one included.
local hits = redis.call('INCR', KEYS[1])
if hits == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[1])
end
return hits
