// The dlock run command: its flags, their parsing and checks, and the
// command's entry point.

package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// Defaults of dlock run's flags.
const (
	defaultKillGrace = 2 * time.Second
	// killReserve is kept on top of --kill-grace in the lease's safety
	// margin: the time dlock itself may need, after the grace, to see the
	// loss, send SIGKILL and have the kernel end the group.
	killReserve = 250 * time.Millisecond
	// groupPoll is how often dlock checks that a stopped command's process
	// group is gone.
	groupPoll = 10 * time.Millisecond
	// minKillGrace is the shortest grace dlock shortens the default to for
	// a short --ttl.
	minKillGrace = 100 * time.Millisecond
	// longTTL is the --ttl above which dlock warns.
	longTTL = 24 * time.Hour
)

// waitForever is the --wait value "forever".
const waitForever = time.Duration(-1)

// waitFlag is --wait: a duration, or "forever".
type waitFlag struct{ d time.Duration }

func (w *waitFlag) String() string {
	if w == nil {
		return "0s"
	}
	if w.d == waitForever {
		return "forever"
	}
	return w.d.String()
}

func (w *waitFlag) Set(s string) error {
	switch strings.ToLower(s) {
	case "forever", "inf", "infinity":
		w.d = waitForever
		return nil
	}
	d, err := parseDuration(s)
	if err != nil {
		if strings.HasPrefix(err.Error(), "want") {
			return errors.New(`want a duration such as 30s or 5m, or "forever"`)
		}
		return err
	}
	if d < 0 {
		return errors.New(`negative; write "forever" to wait without limit`)
	}
	w.d = d
	return nil
}

// lockKind is the kind of lock dlock run takes, as DLOCK_KIND names it.
type lockKind int

const (
	lockExclusive lockKind = iota // a plain Mutex: the write side of the name
	lockFair                      // --fair: a fair Mutex
	lockShared                    // --shared: a reader (RWMutex.RLock)
	lockSemaphore                 // --semaphore N: a permit of Semaphore(NAME, N)
)

// String returns the kind as DLOCK_KIND gives it to the command.
func (k lockKind) String() string {
	switch k {
	case lockFair:
		return "fair"
	case lockShared:
		return "shared"
	case lockSemaphore:
		return "semaphore"
	}
	return "exclusive"
}

// flag returns the run flag that asks for the kind, "" for exclusive.
func (k lockKind) flag() string {
	switch k {
	case lockFair:
		return "--fair"
	case lockShared:
		return "--shared"
	case lockSemaphore:
		return "--semaphore"
	}
	return ""
}

// capability returns what the store needs for the kind; ok is false for a
// plain lock, which every store has.
func (k lockKind) capability() (cp driver.Capability, ok bool) {
	switch k {
	case lockFair:
		return driver.CapFair, true
	case lockShared:
		return driver.CapShared, true
	case lockSemaphore:
		return driver.CapSemaphore, true
	}
	return 0, false
}

// runOptions are dlock run's parsed arguments.
type runOptions struct {
	name      string
	command   []string
	ttl       time.Duration
	wait      time.Duration // 0: try once; waitForever: no limit
	killGrace time.Duration
	metadata  string
	lockDelay time.Duration
	kind      lockKind
	permits   int // --semaphore N: the semaphore's permits
	// conflictCode is the exit status when the lock is not obtained
	// (--conflict-exit-code, -E; default 75).
	conflictCode int
	quiet        bool // --quiet, -q: no messages about waiting or a lock not obtained
	takeOver     bool // --take-over-dead: take over a holder that ended on this host
	verbose      bool // --verbose, -v: say when the lock was obtained and released

	fair, shared bool // the flags, read into kind by parse

	// unreleased is set when the release after the command or hold failed:
	// dlock then exits without waiting on that store again.
	unreleased bool
}

// runFlags returns run's flag set, which fills o and wait.
func runFlags(a *app, o *runOptions, wait *waitFlag) *flag.FlagSet {
	fs := a.newFlagSet("run")
	durationVar(fs, &o.ttl, "ttl", dlock.DefaultTTL)
	fs.Var(wait, "wait", "")
	fs.Var(wait, "timeout", "") // flock's name for it
	fs.IntVar(&o.conflictCode, "conflict-exit-code", exitNotObtained, "")
	fs.IntVar(&o.conflictCode, "E", exitNotObtained, "")
	fs.BoolVar(&o.quiet, "quiet", false, "")
	fs.BoolVar(&o.quiet, "q", false, "")
	fs.BoolVar(&o.verbose, "verbose", false, "")
	fs.BoolVar(&o.takeOver, "take-over-dead", false, "")
	fs.BoolVar(&o.verbose, "v", false, "")
	durationVar(fs, &o.killGrace, "kill-grace", defaultKillGrace)
	fs.StringVar(&o.metadata, "metadata", "", "")
	durationVar(fs, &o.lockDelay, "lock-delay", 0)
	fs.BoolVar(&o.fair, "fair", false, "")
	fs.BoolVar(&o.shared, "shared", false, "")
	fs.IntVar(&o.permits, "semaphore", 0, "")
	return fs
}

func parseRunArgs(a *app, args []string) (*runOptions, error) {
	o := &runOptions{}
	var wait waitFlag
	fs := runFlags(a, o, &wait)
	return o, o.parse(a, fs, &wait, args)
}

func (o *runOptions) parse(a *app, fs *flag.FlagSet, wait *waitFlag, args []string) error {
	flags, positional, command, dash, first := splitArgs(fs, args)
	if !dash && len(positional) > 1 {
		// "dlock run NAME cmd -x": the command's flags are not dlock's.
		return usageErr("run", "put -- between the lock NAME and the command: dlock run %s -- %s",
			strings.Join(args[:first+1], " "), strings.Join(args[first+1:], " "))
	}
	if err := a.parse(fs, "run", flags); err != nil {
		return err
	}
	positional = append(positional, fs.Args()...)
	if err := o.checkAliases(fs); err != nil {
		return err
	}
	if err := envDefaults(fs, wait); err != nil {
		return err
	}
	o.wait = wait.d
	switch {
	case len(positional) == 0 && !dash:
		return usageErr("run", "missing the lock NAME (and -- COMMAND, or nothing to hold it until a signal)")
	case len(positional) == 0:
		return usageErr("run", "missing the lock NAME before --")
	case !dash:
		// No command: hold the lock until a signal (see holdOnly).
	case len(positional) > 1:
		return usageErr("run", "one lock NAME before --, not %d (%s)", len(positional), strings.Join(positional, " "))
	case len(command) == 0:
		return usageErr("run", "no command after --")
	}
	o.name, o.command = positional[0], command
	// Everything the store would refuse is checked before dlock connects to
	// it: a usage error is 64 whatever state the store is in.
	if err := checkNameArg("run", o.name); err != nil {
		return err
	}
	if len(o.metadata) > dlock.MaxMetadataLength {
		return usageErr("run", "--metadata is %d bytes, over the limit of %d", len(o.metadata), dlock.MaxMetadataLength)
	}
	if !utf8.ValidString(o.metadata) {
		return usageErr("run", "--metadata is not valid UTF-8")
	}
	if o.killGrace < 0 {
		return usageErr("run", "--kill-grace %v is negative", o.killGrace)
	}
	if o.lockDelay < 0 {
		return usageErr("run", "--lock-delay %v is negative", o.lockDelay)
	}
	if err := o.parseKind(fs); err != nil {
		return err
	}
	graceSet := false
	fs.Visit(func(f *flag.Flag) { graceSet = graceSet || f.Name == "kill-grace" })
	if fit := o.ttl/2 - killReserve; !graceSet && o.killGrace > fit {
		// The default grace does not fit a short TTL: shorten it, down to
		// minKillGrace, rather than refuse the TTL.
		if fit < minKillGrace {
			return usageErr("run", "--ttl %v is too short for dlock run: it stops the command %v plus a --kill-grace of at least %v "+
				"before the lease could expire, which must be at most half the TTL; give at least --ttl %v",
				o.ttl, killReserve, minKillGrace, 2*(killReserve+minKillGrace))
		}
		o.killGrace = fit
	}
	if o.ttl > longTTL {
		fmt.Fprintf(a.stderr, "dlock: warning: --ttl %s: if dlock dies or loses the store, the lock stays taken that long; "+
			"a TTL of seconds or minutes is renewed for as long as the command runs\n", fmtDuration(o.ttl))
	}
	if margin := o.killGrace + killReserve; margin > o.ttl/2 {
		return usageErr("run", "--kill-grace %v does not fit in half of --ttl %v: dlock stops the command %v (the grace plus %v) "+
			"before the lease could expire, which must be at most half the TTL; raise --ttl to at least %v or lower --kill-grace",
			o.killGrace, o.ttl, margin, killReserve, 2*margin)
	}
	return nil
}

// unreleasedCloseWait bounds closing the Client after a failed release.
const unreleasedCloseWait = 250 * time.Millisecond

// closeWithin closes c and then st, waiting for them at most d: dlock exits
// right after, which ends whatever they still do.
func closeWithin(c *dlock.Client, st *store, d time.Duration) {
	done := make(chan struct{})
	go func() {
		_ = c.Close()
		_ = st.Close()
		close(done)
	}()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
}

// checkAliases refuses a flag given under both of its names, or twice
// under different ones, and the flags that contradict each other: each
// pair sets one value, and the later one would silently win.
func (o *runOptions) checkAliases(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	for _, pair := range [][2]string{{"wait", "timeout"}, {"conflict-exit-code", "E"}, {"quiet", "q"}, {"verbose", "v"}} {
		if set[pair[0]] && set[pair[1]] {
			return usageErr("run", "%s and %s are one flag; give one of them", flagName(pair[0]), flagName(pair[1]))
		}
	}
	if o.quiet && o.verbose {
		return usageErr("run", "--quiet and --verbose exclude each other")
	}
	if o.conflictCode < 0 || o.conflictCode > 255 {
		return usageErr("run", "--conflict-exit-code %d: want an exit status from 0 to 255", o.conflictCode)
	}
	return nil
}

// Environment variables that give run's flags their defaults.
const (
	envTTL  = "DLOCK_TTL"
	envWait = "DLOCK_WAIT"
)

// envDefaults applies DLOCK_TTL and DLOCK_WAIT to --ttl and --wait when the
// command line does not give them.
func envDefaults(fs *flag.FlagSet, wait *waitFlag) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if v, ok := os.LookupEnv(envTTL); ok && v != "" && !set["ttl"] {
		if err := fs.Set("ttl", v); err != nil {
			return usageErr("run", "%s=%q: %v", envTTL, shorten(v, 40), err)
		}
	}
	if v, ok := os.LookupEnv(envWait); ok && v != "" && !set["wait"] && !set["timeout"] {
		if err := wait.Set(v); err != nil {
			return usageErr("run", "%s=%q: %v", envWait, shorten(v, 40), err)
		}
	}
	return nil
}

// flagName writes a flag as help does: -E for a one-letter name, --ttl
// for the others.
func flagName(name string) string {
	if len(name) == 1 {
		return "-" + name
	}
	return "--" + name
}

// parseKind reads --fair, --shared and --semaphore into o.kind.
func (o *runOptions) parseKind(fs *flag.FlagSet) error {
	semaphore := false
	fs.Visit(func(f *flag.Flag) { semaphore = semaphore || f.Name == "semaphore" })
	var given []string
	if o.fair {
		o.kind = lockFair
		given = append(given, "--fair")
	}
	if o.shared {
		o.kind = lockShared
		given = append(given, "--shared")
	}
	if semaphore {
		o.kind = lockSemaphore
		given = append(given, "--semaphore")
	}
	if len(given) > 1 {
		return usageErr("run", "%s exclude each other: a run takes one kind of lock "+
			"(--fair: a fair exclusive lock, --shared: a reader, --semaphore N: one of N permits)", strings.Join(given, " and "))
	}
	if semaphore && (o.permits < 1 || o.permits > dlock.MaxPermits) {
		return usageErr("run", "--semaphore %d: want the number of permits, from 1 to %d", o.permits, dlock.MaxPermits)
	}
	if o.lockDelay > 0 && (o.kind == lockShared || o.kind == lockSemaphore) {
		return usageErr("run", "--lock-delay does not apply to %s: only exclusive locks (a plain or --fair run) keep a lock-delay", o.kind.flag())
	}
	return nil
}

// safetyMargin is the lease's safety margin: a lease that cannot be renewed
// is given up this long before it could expire on the store, which leaves
// the command --kill-grace to stop and dlock the reserve to kill it.
func (o *runOptions) safetyMargin() time.Duration { return o.killGrace + killReserve }

func cmdRun(ctx context.Context, a *app, args []string) error {
	o, err := parseRunArgs(a, args)
	if err != nil {
		return err
	}

	// Catch the signals before anything else, so that one that comes while
	// dlock connects or waits ends the wait cleanly (nothing is left on the
	// store) instead of killing dlock, and one that comes while the command
	// runs is passed on to it.
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, forwardedSignals...)
	defer signal.Stop(sigs)

	lease, st, c, err := acquire(ctx, a, o, sigs)
	if err != nil {
		return err
	}
	defer func() {
		if o.unreleased {
			// The store did not take the release: Close would try it
			// again, for up to another CloseTimeout. The lock expires on
			// the store by itself.
			closeWithin(c, st, unreleasedCloseWait)
			return
		}
		_ = c.Close()
		_ = st.Close()
	}()
	if len(o.command) == 0 {
		return holdOnly(a, o, st, lease, sigs)
	}
	return runHolding(a, o, st, lease, sigs)
}
