package redislock

import (
	"regexp"
	"strings"
	"testing"
)

// TestScriptsPassNumbersAsStrings checks that no script passes redis.call a
// number literal: Redis 7.0 turns a Lua number argument into text with a
// printf of %.17g, dearer than many of the commands it goes to, so the
// scripts write '0' and int(n) (queue.lua) instead.
func TestScriptsPassNumbersAsStrings(t *testing.T) {
	literal := regexp.MustCompile(`redis\.p?call\([^()]*,\s*-?[0-9]+\s*[,)]`)
	scripts := map[string]string{
		"acquire.lua": acquireLua, "release.lua": releaseLua, "renew.lua": renewLua,
		"withdraw.lua": withdrawLua, "common.lua": commonLua, "queue.lua": queueLua,
		"late.lua": lateLua, "acquire_all.lua": acquireAllLua, "describe.lua": describeLua,
		"raise_fence.lua": raiseFenceLua, "move_intent.lua": moveIntentLua,
	}
	for name, src := range scripts {
		for i, line := range strings.Split(src, "\n") {
			if strings.HasPrefix(strings.TrimSpace(line), "--") {
				continue
			}
			if m := literal.FindString(line); m != "" {
				t.Errorf("%s:%d passes a number: %s", name, i+1, m)
			}
		}
	}
}

// TestWithCommonRefusesQueueAfterCommon checks that withCommon refuses a
// script that marks --#queue after --#common (or without it): common.lua
// uses queue.lua's helpers, which Lua must have made first.
func TestWithCommonRefusesQueueAfterCommon(t *testing.T) {
	for _, script := range []string{"--#common\n--#queue\nreturn 1\n", "--#queue\nreturn 1\n"} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("withCommon(%q) did not panic", script)
				}
			}()
			withCommon(script)
		}()
	}
	if s := withCommon("local a = 1\n--#queue\nlocal b = 2\n--#common\nreturn 1\n"); strings.Index(s, queueLua) > strings.Index(s, commonLua) {
		t.Error("withCommon put queue.lua after common.lua")
	}
}
