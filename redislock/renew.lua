-- renew: extend KEYS[1] if the token still holds it; never shorten it.
-- KEYS[1] lock hash   ARGV[1] token   ARGV[2] ttl in ms
-- Returns 1 when renewed, 0 when the token is not the holder.
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then
  if redis.call('PTTL', KEYS[1]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[1], ARGV[2])
  end
  return 1
end
return 0
