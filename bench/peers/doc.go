// Package peers measures dlock side by side with the Go lock libraries users
// compare it with — github.com/go-redsync/redsync/v4 (one node and Redlock)
// and github.com/bsm/redislock — on the same Redis servers, in the same run,
// with the same measuring engine (internal/bench) that `dlock bench` uses.
//
// It is a module of its own, never imported by dlock, so that the peers are
// dependencies of the comparison only. TestCompare runs the comparison and
// prints the table and the target ratios; see README.md for the command of
// the full run.
//
// Each peer runs at its documented defaults and at a tuned setting (see
// RedsyncDefault, RedsyncTuned, BSMDefault and BSMTuned for the exact values
// and where the defaults come from). The adapters make every peer's Lock
// block until the lock is held, as dlock's does: they call the library's
// lock function again each time it gives up with its "not obtained" error,
// and the bench counts the wait from the first call.
package peers
