-- record_late: record acquire requests of which a copy may still land,
-- though no release will name them (see late.lua, which scripts.go puts in
-- front of this script): a request go-redis wrote twice whose answer was a
-- refusal.
-- KEYS[1] the late-request record   ARGV the request ids
local ms = {}
for i, id in ipairs(ARGV) do
  ms[i] = 'r' .. id
end
remember(KEYS[1], ms, nil, false)
return 0
