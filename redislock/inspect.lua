-- inspect: describe the lock without changing it (after describe.lua).
-- Returns describe()'s answer, or nil when the lock is not held.
return describe() or false
