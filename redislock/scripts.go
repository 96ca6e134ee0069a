// The Lua scripts: embedding them (with common.lua put in) and running them
// with EVALSHA, singly or pipelined, falling back to EVAL on NOSCRIPT.

package redislock

import (
	"context"
	_ "embed"
	"errors"
	"strings"

	"github.com/redis/go-redis/v9"
)

// The scripts run by EVALSHA; Script.Run falls back to EVAL on NOSCRIPT,
// which also puts the script back in the server's cache.
var (
	// common.lua holds the helpers of the scripts that handle shared holds,
	// writer intents and fair queues. withCommon puts it in the place a
	// script marks, after its fast path when it has one: Lua makes its
	// functions as the script runs, and the fast path needs none of them.
	//go:embed common.lua
	commonLua string

	// queue.lua holds the helpers that hand an exclusive lock to the head
	// of the fair queue: withCommon puts it where a script marks it
	// (release.lua, before its handoff fast path), else in front of
	// common.lua.
	//go:embed queue.lua
	queueLua string

	//go:embed acquire.lua
	acquireLua    string
	acquireScript = redis.NewScript(withCommon(acquireLua))

	//go:embed renew.lua
	renewLua    string
	renewScript = redis.NewScript(withCommon(renewLua))

	// late.lua writes the late-request record; it goes in front of the
	// scripts that write it, fast paths included.
	//go:embed late.lua
	lateLua string

	//go:embed release.lua
	releaseLua    string
	releaseScript = redis.NewScript(lateLua + withCommon(releaseLua))

	//go:embed withdraw.lua
	withdrawLua    string
	withdrawScript = redis.NewScript(lateLua + withCommon(withdrawLua))

	//go:embed record_late.lua
	recordLateLua    string
	recordLateScript = redis.NewScript(lateLua + recordLateLua)

	// inspect.lua and force_release.lua both begin with describe.lua.
	//go:embed describe.lua
	describeLua string

	//go:embed inspect.lua
	inspectLua    string
	inspectScript = redis.NewScript(withCommon(describeLua) + inspectLua)

	//go:embed force_release.lua
	forceReleaseLua    string
	forceReleaseScript = redis.NewScript(withCommon(describeLua) + forceReleaseLua)

	//go:embed break_if.lua
	breakIfLua    string
	breakIfScript = redis.NewScript(breakIfLua)

	//go:embed raise_fence.lua
	raiseFenceLua    string
	raiseFenceScript = redis.NewScript(withCommon(raiseFenceLua))

	//go:embed fenced_set.lua
	fencedSetLua    string
	fencedSetScript = redis.NewScript(fencedSetLua)

	//go:embed fenced_get.lua
	fencedGetLua    string
	fencedGetScript = redis.NewScript(fencedGetLua)

	//go:embed fenced_claim.lua
	fencedClaimLua    string
	fencedClaimScript = redis.NewScript(fencedClaimLua)

	//go:embed move_intent.lua
	moveIntentLua    string
	moveIntentScript = redis.NewScript(moveIntentLua)
)

// The hashes of the scripts on the hot path, boxed once as EVALSHA
// arguments.
var (
	acquireSHA any = acquireScript.Hash()
	renewSHA   any = renewScript.Hash()
	releaseSHA any = releaseScript.Hash()
)

// evalShaArgs returns the arguments of an EVALSHA of the script whose hash
// is sha with nkeys keys and nargs script arguments: "evalsha", sha, nkeys,
// then nkeys+nargs slots for the caller to fill, keys first. One slice is
// the whole command, where Script.Run would copy keys and arguments into a
// new one and box every key and the hash again.
func evalShaArgs(sha any, nkeys, nargs int) []any {
	args := make([]any, 3+nkeys+nargs)
	args[0], args[1], args[2] = "evalsha", sha, nkeys
	return args
}

// runEvalSha sends args (made by evalShaArgs and filled) and, when the
// server does not have the script, runs script by EVAL with the same keys
// and arguments, as Script.Run does.
func runEvalSha(ctx context.Context, rdb redis.UniversalClient, script *redis.Script, args []any) *redis.Cmd {
	cmd := redis.NewCmd(ctx, args...)
	if args[2] != 0 {
		cmd.SetFirstKeyPos(3) // as Script.Run does, for Cluster routing
	}
	_ = rdb.Process(ctx, cmd)
	if !isNoScript(cmd.Err()) {
		return cmd
	}
	unsent(args)
	c := splitEvalSha(args)
	return script.Eval(ctx, rdb, c.keys, c.args...)
}

// unsent forgets the write of the request id among args, an EVALSHA that
// the server refused for want of its script: that copy never ran, and it
// cannot run later, since it was answered. (An id written more than once
// keeps its count: another copy may still be on its way, and the script
// that is about to be loaded would run it.)
func unsent(args []any) {
	for _, a := range args {
		if r, ok := a.(*requestArg); ok {
			r.writes.CompareAndSwap(1, 0)
		}
	}
}

// splitEvalSha returns the keys and script arguments of args, made by
// evalShaArgs and filled.
func splitEvalSha(args []any) scriptCall {
	n, _ := args[2].(int)
	keys := make([]string, n)
	for i := range keys {
		keys[i], _ = args[3+i].(string)
	}
	return scriptCall{keys: keys, args: args[3+n:]}
}

// commonMark and queueMark are the lines of a script that withCommon
// replaces.
const (
	commonMark = "--#common\n"
	queueMark  = "--#queue\n"
)

// withCommon returns script with common.lua in place of its line
// "--#common", or in front of it when it has no such line, and queue.lua
// in place of its line "--#queue", or in front of common.lua when it has
// no such line.
func withCommon(script string) string {
	common := queueLua + commonLua
	if q := strings.Index(script, queueMark); q >= 0 {
		if c := strings.Index(script, commonMark); c < q {
			// common.lua uses queue.lua's helpers.
			panic("redislock: a script marks --#queue without --#common after it")
		}
		script, common = strings.Replace(script, queueMark, queueLua, 1), commonLua
	}
	if !strings.Contains(script, commonMark) {
		return common + script
	}
	return strings.Replace(script, commonMark, common, 1)
}

// scriptCall is one run of a script in a pipeline.
type scriptCall struct {
	keys []string
	args []any
}

// runPipelined runs script once per call in one pipeline and returns one
// command per call, in order. When calls fail with NOSCRIPT (the script
// cache was flushed, or a failover reached a node that never saw the
// script), they are sent again in one more pipeline: the first as EVAL,
// which caches the script as it runs it, the others as EVALSHA behind it,
// so that a batch of thousands of renewals after a restart sends the script
// once, not once per lease. On a ClusterClient go-redis splits pipelines by
// node and keeps their order on each node, so each further pass caches the
// script on at least one more node; after maxScriptPasses the rest go as
// EVAL.
func runPipelined(ctx context.Context, rdb redis.Cmdable, script *redis.Script, calls []scriptCall) []*redis.Cmd {
	cmds := make([]*redis.Cmd, len(calls))
	pipe := rdb.Pipeline()
	for i, c := range calls {
		cmds[i] = pipe.EvalSha(ctx, script.Hash(), c.keys, c.args...)
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below

	for pass := 1; ; pass++ {
		var retry []int
		for i, cmd := range cmds {
			if isNoScript(cmd.Err()) {
				retry = append(retry, i)
			}
		}
		if len(retry) == 0 || ctx.Err() != nil {
			return cmds
		}
		pipe = rdb.Pipeline()
		for j, i := range retry {
			if j == 0 || pass >= maxScriptPasses {
				cmds[i] = script.Eval(ctx, pipe, calls[i].keys, calls[i].args...)
			} else {
				cmds[i] = pipe.EvalSha(ctx, script.Hash(), calls[i].keys, calls[i].args...)
			}
		}
		_, _ = pipe.Exec(ctx)
		if pass >= maxScriptPasses {
			return cmds
		}
	}
}

// maxScriptPasses bounds the pipelines runPipelined sends after NOSCRIPT.
const maxScriptPasses = 8

// isNoScript reports whether err says the server does not have the script.
// go-redis normalises the error to redis.ErrNoScript only outside pipelines.
func isNoScript(err error) bool {
	return err != nil && (errors.Is(err, redis.ErrNoScript) || redis.HasErrorPrefix(err, "NOSCRIPT"))
}
