// The dlock run command: its flags, their parsing and checks, and the
// command's entry point.

package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/spf13/pflag"
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

// Type names the flag's value in generated docs and completion.
func (w *waitFlag) Type() string { return "duration" }

// timeoutFlag is --timeout: --wait under flock's name, which also takes
// flock's bare seconds ("5", "0.5").
type timeoutFlag struct{ *waitFlag }

// Set reads a number of seconds, a duration or "forever".
func (t timeoutFlag) Set(s string) error {
	if plainNumber.MatchString(s) {
		secs, err := strconv.ParseFloat(s, 64)
		if err != nil || secs > float64(math.MaxInt64/time.Second) {
			return errors.New(`want a number of seconds, a duration such as 30s or 5m, or "forever"`)
		}
		t.d = time.Duration(secs * float64(time.Second))
		return nil
	}
	return t.waitFlag.Set(s)
}

// Set reads a duration or "forever".
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

	fair   bool // --fair: granted in arrival order (of every kind)
	shared bool // --shared, read into kind by parse

	// unreleased is set when the release after the command or hold failed:
	// dlock then exits without waiting on that store again.
	unreleased bool
}

// runFlags adds run's flags to fs, which fill o and wait.
func runFlags(fs *pflag.FlagSet, o *runOptions, wait *waitFlag) {
	durationVar(fs, &o.ttl, "ttl", dlock.DefaultTTL, "the lease's time to live on the store (default $DLOCK_TTL, else 10s)")
	fs.Var(wait, "wait", `longest wait for the lock; 0 tries once, "forever" waits without limit (default $DLOCK_WAIT, else 0)`)
	fs.Var(timeoutFlag{wait}, "timeout", "the same as --wait, under flock's name; a bare number is seconds, as flock's")
	fs.IntVarP(&o.conflictCode, "conflict-exit-code", "E", exitNotObtained, "exit status when the lock is not obtained")
	fs.BoolVarP(&o.quiet, "quiet", "q", false, "no messages about waiting, a lock not obtained or a command ended by a signal")
	fs.BoolVarP(&o.verbose, "verbose", "v", false, "also say when the lock was obtained and released")
	fs.BoolVar(&o.takeOver, "take-over-dead", false, "take over at once a lock whose holder, a process of this host, has ended (Linux)")
	durationVar(fs, &o.killGrace, "kill-grace", defaultKillGrace, "time between SIGTERM and SIGKILL when the lock is lost")
	fs.StringVar(&o.metadata, "metadata", "", "free text stored with the lock, shown to waiters and by dlock ls")
	durationVar(fs, &o.lockDelay, "lock-delay", 0, "after a lease expires without a release, keep the lock from others this much longer (Redis, Redlock)")
	fs.BoolVar(&o.fair, "fair", false, "waiters get the lock in arrival order; with --shared or --semaphore a fair reader or permit (Redis)")
	fs.BoolVar(&o.shared, "shared", false, "a shared (read) lock: exclusive runs wait for it")
	fs.IntVar(&o.permits, "semaphore", 0, "one of N permits (N from 1 to 1048576)")
}

// runCommand defines run's flags on fs and returns what runs it.
func runCommand(a *app, fs *pflag.FlagSet) runner {
	o := &runOptions{}
	var wait waitFlag
	runFlags(fs, o, &wait)
	return func(ctx context.Context, args []string, dash int) error {
		if err := o.parse(a, fs, &wait, args, dash); err != nil {
			return err
		}
		return cmdRun(ctx, a, o)
	}
}

// parseRunArgs parses run's arguments as dlock run does (for tests).
func parseRunArgs(a *app, args []string) (*runOptions, error) {
	o := &runOptions{}
	var wait waitFlag
	fs := pflag.NewFlagSet("run", pflag.ContinueOnError)
	fs.SetOutput(io.Discard)
	a.globalFlags(fs)
	runFlags(fs, o, &wait)
	a.cmdArgs = args
	if err := fs.Parse(args); err != nil {
		if err := putDashBetween(fs, args); err != nil {
			return o, err
		}
		return o, flagError("run", fs, err)
	}
	return o, o.parse(a, fs, &wait, fs.Args(), fs.ArgsLenAtDash())
}

// putDashBetween returns the usage error for run's arguments given as
// "dlock run NAME cmd -x": the command's flags are not dlock's. It returns
// nil for arguments with a "--", or with one positional argument at most.
func putDashBetween(fs *pflag.FlagSet, raw []string) error {
	if err := flockCommand(fs, raw); err != nil {
		return err
	}
	s := splitArgs(fs, raw)
	if s.dash || len(s.positional) < 2 {
		return nil
	}
	return usageErr("run", "put -- between the lock NAME and the command: dlock run %s -- %s",
		strings.Join(raw[:s.first+1], " "), strings.Join(raw[s.first+1:], " "))
}

// parse checks run's arguments, parsed by fs (dash of them before "--", -1
// without one), and fills o.
func (o *runOptions) parse(a *app, fs *pflag.FlagSet, wait *waitFlag, args []string, dash int) error {
	positional, command := args, []string(nil)
	if dash >= 0 {
		positional, command = args[:dash], args[dash:]
	} else if len(positional) > 1 {
		if err := putDashBetween(fs, a.cmdArgs); err != nil {
			return err
		}
		return usageErr("run", "put -- between the lock NAME and the command: dlock run %s -- %s",
			positional[0], strings.Join(positional[1:], " "))
	}
	if err := o.checkAliases(fs, splitArgs(fs, a.cmdArgs).spelled); err != nil {
		return err
	}
	if err := envDefaults(fs, wait); err != nil {
		return err
	}
	o.wait = wait.d
	switch {
	case len(positional) == 0 && dash < 0:
		return usageErr("run", "missing the lock NAME (and -- COMMAND, or nothing to hold it until a signal)")
	case len(positional) == 0:
		return usageErr("run", "missing the lock NAME before --")
	case dash < 0:
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
	graceSet := fs.Changed("kill-grace")
	ttl := ttlSource(fs)
	if o.ttl <= 0 {
		return usageErr("run", "%s%v is not a time to live: give a positive duration, such as %s10s", ttl, o.ttl, ttl)
	}
	if fit := o.ttl/2 - killReserve; !graceSet && o.killGrace > fit {
		// The default grace does not fit a short TTL: shorten it, down to
		// minKillGrace, rather than refuse the TTL.
		if fit < minKillGrace {
			return usageErr("run", "%s%v is too short for dlock run: it stops the command %v plus a --kill-grace of at least %v "+
				"before the lease could expire, which must be at most half the TTL; give at least %s%v",
				ttl, o.ttl, killReserve, minKillGrace, ttl, 2*(killReserve+minKillGrace))
		}
		o.killGrace = fit
	}
	if o.ttl > longTTL {
		fmt.Fprintf(a.msgs(), "dlock: warning: %s%s: if dlock dies or loses the store, the lock stays taken that long; "+
			"a TTL of seconds or minutes is renewed for as long as the command runs\n", ttl, fmtDuration(o.ttl))
	}
	if margin := o.killGrace + killReserve; margin > o.ttl/2 {
		return usageErr("run", "--kill-grace %v does not fit in half of %s%v: dlock stops the command %v (the grace plus %v) "+
			"before the lease could expire, which must be at most half the TTL; raise %s to at least %v or lower --kill-grace",
			o.killGrace, ttl, o.ttl, margin, killReserve, strings.TrimRight(ttl, " ="), 2*margin)
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

// checkAliases refuses a flag given under both of its names (spelled has
// the names as given), and the flags that contradict each other: each
// pair sets one value, and the later one would silently win.
func (o *runOptions) checkAliases(fs *pflag.FlagSet, spelled map[string]bool) error {
	if fs.Changed("wait") && fs.Changed("timeout") {
		return usageErr("run", "--wait and --timeout are one flag; give one of them")
	}
	for _, pair := range [][2]string{{"--conflict-exit-code", "-E"}, {"--quiet", "-q"}, {"--verbose", "-v"}} {
		if spelled[pair[0]] && spelled[pair[1]] {
			return usageErr("run", "%s and %s are one flag; give one of them", pair[0], pair[1])
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

// ttlSource is how the messages about the TTL name it, before its value:
// "DLOCK_TTL=" when that variable gave it, else "--ttl ".
func ttlSource(fs *pflag.FlagSet) string {
	if !fs.Changed("ttl") && os.Getenv(envTTL) != "" {
		return envTTL + "="
	}
	return "--ttl "
}

// envDefaults applies DLOCK_TTL and DLOCK_WAIT to --ttl and --wait when the
// command line does not give them.
func envDefaults(fs *pflag.FlagSet, wait *waitFlag) error {
	if v, ok := os.LookupEnv(envTTL); ok && v != "" && !fs.Changed("ttl") {
		if err := fs.Lookup("ttl").Value.Set(v); err != nil {
			return usageErr("run", "%s=%q: %v", envTTL, shorten(v, 40), err)
		}
	}
	if v, ok := os.LookupEnv(envWait); ok && v != "" && !fs.Changed("wait") && !fs.Changed("timeout") {
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

// parseKind reads --fair, --shared and --semaphore into o.kind and o.fair:
// --fair alone is a fair exclusive lock, and with --shared or --semaphore a
// fair reader or permit.
func (o *runOptions) parseKind(fs *pflag.FlagSet) error {
	semaphore := fs.Changed("semaphore")
	if o.shared && semaphore {
		return usageErr("run", "--shared and --semaphore exclude each other: a run takes one kind of lock "+
			"(--shared: a reader, --semaphore N: one of N permits; either with --fair to be granted in arrival order)")
	}
	switch {
	case o.shared:
		o.kind = lockShared
	case semaphore:
		o.kind = lockSemaphore
	case o.fair:
		o.kind = lockFair
	}
	if semaphore && (o.permits < 1 || o.permits > dlock.MaxPermits) {
		return usageErr("run", "--semaphore %d: want the number of permits, from 1 to %d", o.permits, dlock.MaxPermits)
	}
	if o.lockDelay > 0 && (o.kind == lockShared || o.kind == lockSemaphore) {
		return usageErr("run", "--lock-delay does not apply to %s: only exclusive locks (a plain run, or --fair alone) keep a lock-delay", o.kindFlags())
	}
	return nil
}

// kindFlags returns the flags that ask for o's kind as the user gives them
// ("--fair --semaphore"), "" for a plain run.
func (o *runOptions) kindFlags() string {
	if o.fair && o.kind != lockFair {
		return "--fair " + o.kind.flag()
	}
	return o.kind.flag()
}

// needs returns the capabilities the store must have for o's kind, the
// one that names the kind best first.
func (o *runOptions) needs() []driver.Capability {
	var cps []driver.Capability
	if o.fair && o.kind != lockFair {
		cps = append(cps, driver.CapFairShared)
	}
	if cp, ok := o.kind.capability(); ok {
		cps = append(cps, cp)
	}
	return cps
}

// safetyMargin is the lease's safety margin: a lease that cannot be renewed
// is given up this long before it could expire on the store, which leaves
// the command --kill-grace to stop and dlock the reserve to kill it.
func (o *runOptions) safetyMargin() time.Duration { return o.killGrace + killReserve }

func cmdRun(ctx context.Context, a *app, o *runOptions) error {
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
