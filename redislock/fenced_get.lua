-- fenced_get: read a value written by fenced_set with its fence.
-- KEYS[1] resource hash. Returns {value, fence}; both nil when missing.
return redis.call('HMGET', KEYS[1], 'value', 'fence')
