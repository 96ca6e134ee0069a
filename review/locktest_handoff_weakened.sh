#!/bin/sh
# Review: the branch's locktest handoff cases no longer catch a Redis handoff
# that skips a fence. Mutates redislock/common.lua (handoff INCRs twice), runs
# the two cases with the branch's locktest (passes) and main's (fails), and
# restores both files.
set -u
cd "$(dirname "$0")/.."
cp redislock/common.lua /tmp/common.lua.$$ ; cp locktest/handoff.go /tmp/handoff.go.$$
trap 'cp /tmp/common.lua.$$ redislock/common.lua; cp /tmp/handoff.go.$$ locktest/handoff.go' EXIT
sed -i "s/^  local fence = redis.call('INCR', F)\$/  redis.call('INCR', F)\n  local fence = redis.call('INCR', F)/" redislock/common.lua
run() { CI=true go test -count=1 -run 'TestConformance/^Handoff(WithoutRequest|NoticeLost)$' ./redislock/ 2>&1 | tail -6; }
echo "== branch locktest (mutated Redis):"; run
git show main:locktest/handoff.go > locktest/handoff.go
echo "== main locktest (mutated Redis):"; run
