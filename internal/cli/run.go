package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
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
	d, err := time.ParseDuration(s)
	if err != nil {
		if n, nerr := strconv.Atoi(s); nerr == nil && n != 0 {
			return fmt.Errorf("%q has no unit; write %ds or %dm", s, n, n)
		}
		return errors.New(`want a duration such as 30s or 5m, or "forever"`)
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

	fair, shared bool // the flags, read into kind by parse
}

// runFlags returns run's flag set, which fills o and wait.
func runFlags(a *app, o *runOptions, wait *waitFlag) *flag.FlagSet {
	fs := a.newFlagSet("run")
	fs.DurationVar(&o.ttl, "ttl", dlock.DefaultTTL, "")
	fs.Var(wait, "wait", "")
	fs.DurationVar(&o.killGrace, "kill-grace", defaultKillGrace, "")
	fs.StringVar(&o.metadata, "metadata", "", "")
	fs.DurationVar(&o.lockDelay, "lock-delay", 0, "")
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
	o.wait = wait.d
	switch {
	case len(positional) == 0 && !dash:
		return usageErr("run", "missing the lock NAME and the command")
	case len(positional) == 0:
		return usageErr("run", "missing the lock NAME before --")
	case !dash:
		return usageErr("run", "missing -- and the command after the lock NAME: dlock run %s -- COMMAND [ARGS...]", positional[0])
	case len(positional) > 1:
		return usageErr("run", "one lock NAME before --, not %d (%s)", len(positional), strings.Join(positional, " "))
	case len(command) == 0:
		return usageErr("run", "no command after --")
	}
	o.name, o.command = positional[0], command
	// Everything the store would refuse is checked before dlock connects to
	// it: a usage error is 64 whatever state the store is in.
	if err := dlock.CheckName(o.name); err != nil {
		return usageErr("run", "lock %s", strings.TrimPrefix(err.Error(), "dlock: invalid argument: "))
	}
	if len(o.metadata) > dlock.MaxMetadataLength {
		return usageErr("run", "--metadata is %d bytes, over the limit of %d", len(o.metadata), dlock.MaxMetadataLength)
	}
	if !utf8.ValidString(o.metadata) {
		return usageErr("run", "--metadata is not valid UTF-8")
	}
	if o.ttl < dlock.MinTTL {
		return usageErr("run", "--ttl %v is below the minimum, %v", o.ttl, dlock.MinTTL)
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
	if margin := o.killGrace + killReserve; margin > o.ttl/2 {
		return usageErr("run", "--kill-grace %v does not fit in half of --ttl %v: dlock stops the command %v (the grace plus %v) "+
			"before the lease could expire, which must be at most half the TTL; raise --ttl to at least %v or lower --kill-grace",
			o.killGrace, o.ttl, margin, killReserve, 2*margin)
	}
	return nil
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
	defer st.Close()
	defer c.Close()
	return runHolding(a, o, st, lease, sigs)
}

// interrupted is the error of a wait ended by a signal.
func interrupted(name string, sig os.Signal) *exitError {
	return fail(exitSignalBase+signalNumber(sig), "%s while waiting for %q; nothing was left on the store", signalName(sig), name)
}

// cancelOnSignal returns ctx, cancelled when a signal arrives on sigs, and
// the function that stops watching and returns the signal caught, if any.
// It must be called once.
func cancelOnSignal(ctx context.Context, sigs <-chan os.Signal) (context.Context, func() os.Signal) {
	ctx, cancel := context.WithCancel(ctx)
	var (
		caught os.Signal
		wg     sync.WaitGroup
		stop   = make(chan struct{})
	)
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case caught = <-sigs:
			cancel()
		case <-stop:
		}
	}()
	return ctx, func() os.Signal {
		close(stop)
		wg.Wait()
		cancel()
		return caught
	}
}

// acquire connects to the store and takes the lock, watching sigs meanwhile.
// On success the caller closes the Client and then the store.
func acquire(ctx context.Context, a *app, o *runOptions, sigs <-chan os.Signal) (*dlock.Lease, *store, *dlock.Client, error) {
	ctx, stopWatch := cancelOnSignal(ctx, sigs)

	st, err := a.open(ctx)
	if err != nil {
		if sig := stopWatch(); sig != nil {
			return nil, nil, nil, interrupted(o.name, sig)
		}
		return nil, nil, nil, err
	}
	if ld, ok := st.backend.(driver.LockDelayer); o.lockDelay > 0 && (!ok || !ld.SupportsLockDelay()) {
		stopWatch()
		_ = st.Close()
		return nil, nil, nil, usageErr("run", "--lock-delay needs a Redis or Redlock backend; %s keeps no lock-delay", st.where)
	}
	if cp, ok := o.kind.capability(); ok {
		if cb, ok := st.backend.(driver.Capabler); !ok || !cb.Supports(cp) {
			stopWatch()
			_ = st.Close()
			return nil, nil, nil, usageErr("run", "%s needs a store with %s; %s has none (the SQL stores and the redis:// ones have them)",
				o.kind.flag(), cp, st.where)
		}
	}
	c := dlock.New(st.backend)
	closeAll := func() {
		_ = c.Close()
		_ = st.Close()
	}
	opts := []dlock.Option{
		dlock.WithTTL(o.ttl),
		dlock.WithSafetyMargin(o.safetyMargin()),
		dlock.WithMetadata(o.metadata),
	}
	var (
		lease *dlock.Lease
		rep   *waitReporter
	)
	if o.wait == 0 {
		lease, err = o.take(c, opts, false)(ctx)
	} else {
		rep = startWaitReporter(a.stderr, o, st)
		opts = append(opts, dlock.WithOnBusy(rep.busy))
		if o.wait != waitForever {
			opts = append(opts, dlock.WithWait(o.wait))
		}
		lease, err = o.take(c, opts, true)(ctx)
		rep.Stop()
	}
	sig := stopWatch()
	switch {
	case err == nil && sig != nil:
		// Obtained just as the signal came: give it back unused.
		uctx, ucancel := context.WithTimeout(context.Background(), a.connectTimeout)
		_ = lease.Unlock(uctx)
		ucancel()
		closeAll()
		return nil, nil, nil, interrupted(o.name, sig)
	case err == nil:
		return lease, st, c, nil
	}
	defer closeAll()
	var notObtained *dlock.NotObtainedError
	switch {
	case sig != nil:
		return nil, nil, nil, interrupted(o.name, sig)
	case errors.Is(err, dlock.ErrInvalid):
		return nil, nil, nil, usageErr("run", "%s", strings.TrimPrefix(err.Error(), "dlock: invalid argument: "))
	case errors.As(err, &notObtained):
		return nil, nil, nil, notObtainedErr(st, o, notObtained)
	}
	return nil, nil, nil, st.storeErr(fmt.Sprintf("lock %q", o.name), err)
}

// take returns the call that takes the lock of o's kind from c: the one
// that waits (subject to WithWait among opts) when wait is set, else the one
// that tries once.
func (o *runOptions) take(c *dlock.Client, opts []dlock.Option, wait bool) func(context.Context) (*dlock.Lease, error) {
	switch o.kind {
	case lockShared:
		rw := c.RWMutex(o.name, opts...)
		if wait {
			return rw.RLock
		}
		return rw.TryRLock
	case lockSemaphore:
		s := c.Semaphore(o.name, o.permits, opts...)
		if wait {
			return s.Acquire
		}
		return s.TryAcquire
	case lockFair:
		opts = append(opts, dlock.Fair())
	}
	m := c.Mutex(o.name, append(opts, dlock.WithLockDelay(o.lockDelay))...)
	if wait {
		return m.Lock
	}
	return m.TryLock
}

// notObtainedErr is exit 75, saying what stood in the way.
func notObtainedErr(st *store, o *runOptions, e *dlock.NotObtainedError) *exitError {
	r := &waitReporter{name: o.name, kind: o.kind, permits: o.permits, store: st}
	what, afterIs := r.obstacle(e, false)
	var b strings.Builder
	switch {
	case o.wait == 0 && afterIs:
		fmt.Fprintf(&b, "%q is %s", o.name, what)
	case o.wait == 0:
		fmt.Fprintf(&b, "%q: %s", o.name, what)
	default:
		fmt.Fprintf(&b, "%q not obtained within %s: %s", o.name, o.wait, what)
	}
	if o.wait == 0 {
		b.WriteString("; not waiting (--wait 0)")
	}
	return fail(exitNotObtained, "%s", b.String())
}

// runHolding runs the command while lease holds the lock, and releases it
// when every process of the command's group has ended.
func runHolding(a *app, o *runOptions, st *store, lease *dlock.Lease, sigs <-chan os.Signal) error {
	cmd := exec.Command(o.command[0], o.command[1:]...)
	cmd.Stdin = os.Stdin
	cmd.Stdout = a.stdout
	cmd.Stderr = a.stderr
	cmd.Env = childEnv(withoutCredentials(os.Environ()), lease, o.kind)
	cmd.SysProcAttr = childProcAttr()
	release := func() error {
		// Bounded like connecting: a store that does not answer lets the
		// lock expire after its TTL anyway.
		ctx, cancel := context.WithTimeout(context.Background(), min(o.ttl, a.connectTimeout))
		defer cancel()
		return lease.Unlock(ctx)
	}

	w := &childWatch{stderr: a.stderr, o: o, lease: lease, sigs: sigs}
	if len(suspendSignals) > 0 {
		stops := make(chan os.Signal, 1)
		signal.Notify(stops, suspendSignals...)
		defer signal.Stop(stops)
		w.stops = stops
	}
	if len(childSignals) > 0 {
		// Always: a command in a background process group that reads from
		// the terminal is stopped (SIGTTIN), and would otherwise hold the
		// lock forever, stopped.
		chld := make(chan os.Signal, 1)
		signal.Notify(chld, childSignals...)
		defer signal.Stop(chld)
		w.chld = chld
	}
	if restore, ok := handTerminal(cmd.SysProcAttr); ok {
		defer restore()
	}
	becomeSubreaper()
	// The lease may have been lost while dlock took the terminal, or even
	// before: a renewal refused right after the grant. The command must not
	// start unprotected.
	select {
	case <-lease.Done():
		_ = release()
		return fail(exitLost, "lock %q was lost before the command started (%s); the command was not run",
			o.name, lossReason(lease.Err()))
	default:
	}
	exited, err := startLocked(cmd)
	if err != nil {
		_ = release()
		return startErr(o.command[0], err)
	}
	w.pgid = cmd.Process.Pid
	w.exited = exited

	end := w.wait()
	code, how := exitStatus(cmd.ProcessState)
	if end == endLost {
		_ = release() // a lease lost for want of renewals may still be on the store
		return fail(exitLost, "the command %s after the lock %q was lost", how, o.name)
	}
	err = release()
	switch {
	case err == nil:
	case errors.Is(err, dlock.ErrNotHeld):
		return fail(exitLost, "lock %q was lost before the command ended (it %s); the command may have run unprotected at the end",
			o.name, how)
	default:
		fmt.Fprintf(a.stderr, "dlock: could not release %q; it expires on the store within %v: %s\n",
			o.name, o.ttl, oneLine(scrub(err.Error(), st.secrets)))
	}
	if end == endStuck {
		if code == exitOK {
			code = exitSignalBase + signalNumber(sigTerm)
		}
		return fail(code, "the command %s: dlock ended it because it stopped again each time it was continued "+
			"(a process in the background that reads from the terminal is stopped so, by SIGTTIN; COMMAND has "+
			"the terminal only when dlock's stdin is that terminal and dlock is in its foreground)", how)
	}
	return &exitError{code: code}
}

// startLocked starts cmd from a goroutine locked to its OS thread, and waits
// for it there: the kernel sends the command its parent death signal (see
// setParentDeathSignal) when the thread that started it exits, and the Go
// runtime ends a thread when a goroutine that locked it returns without
// unlocking it; a thread that is not kept locked could be taken by such a
// goroutine while the command runs, and its end would kill the command. The
// returned channel is closed when the command has been waited for
// (cmd.ProcessState is then set).
func startLocked(cmd *exec.Cmd) (<-chan struct{}, error) {
	started := make(chan error, 1)
	exited := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		// Unlocked only once the command is gone: its death signal no
		// longer matters then.
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		_ = cmd.Wait() // the status is read from cmd.ProcessState
		close(exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}

// Timings of childWatch.
const (
	// stopPoll is how often dlock looks for stopped processes in the
	// command's group; a stop of the command's own process is seen at once
	// (SIGCHLD).
	stopPoll = time.Second
	// stopRecheck is how soon after continuing a stopped group dlock looks
	// again: a process that is stopped again by then is not going to run.
	stopRecheck = 50 * time.Millisecond
	// maxRestops is how many times in a row dlock continues a group that
	// stops again at once before it gives up and stops the command.
	maxRestops = 5
	// maxGroupPoll is the longest pause between two checks for the end of
	// the group once the command's own process has exited.
	maxGroupPoll = 200 * time.Millisecond
	// lingerNote is how long after the command's own process has exited,
	// its group still running, dlock says why it still holds the lock.
	lingerNote = time.Second
)

// childWatch follows a running command.
type childWatch struct {
	stderr io.Writer
	o      *runOptions
	lease  *dlock.Lease
	pgid   int              // the command's process group (its PID)
	sigs   <-chan os.Signal // signals to pass on
	stops  <-chan os.Signal // SIGTSTP to dlock, nil where there is none
	chld   <-chan os.Signal // SIGCHLD, nil where there is none
	exited <-chan struct{}  // closed when the command has been waited for
}

// watchEnd is how the command's process group ended.
type watchEnd int

const (
	endNormal watchEnd = iota // by itself
	endLost                   // stopped by dlock: the lease was lost
	endStuck                  // stopped by dlock: it kept stopping
)

// wait waits until the command has exited and every other process of its
// group has ended too, passing signals on to the group. A process the
// command leaves behind in its group (cmd &) is still protected by the lock,
// which is kept, and renewed, until it ends.
//
// When the lease is lost first, it stops the group (SIGTERM, then SIGKILL
// after --kill-grace), waits until the whole group is gone, and reports
// endLost.
//
// The command is not allowed to be suspended, nor is dlock: renewals would
// stop or go on for a command that does nothing, and the lease could lapse
// while the command still runs. A stopped process of the group is continued
// (Ctrl-Z is answered with a message); a group that stops again each time
// it is continued (a background process reading from the terminal) is
// stopped like one whose lease was lost, and wait reports endStuck.
func (w *childWatch) wait() watchEnd {
	var (
		end       = endNormal
		stopping  bool
		killTimer *time.Timer
		killC     <-chan time.Time
		leaderC   = w.exited
		leaderAt  time.Time // when the command's own process exited
		noted     bool
		groupT    = time.NewTimer(time.Hour)
		groupC    <-chan time.Time // polls for the group's end
		pollDelay = groupPoll
		recheck   = time.NewTimer(time.Hour)
		recheckC  <-chan time.Time
		restops   int       // SIGCONTs since the group was last seen running
		lastCont  time.Time // the last SIGCONT of checkStopped
		stopTick  = time.NewTicker(stopPoll)
	)
	groupT.Stop()
	recheck.Stop()
	defer func() {
		groupT.Stop()
		recheck.Stop()
		stopTick.Stop()
		if killTimer != nil {
			killTimer.Stop()
		}
	}()
	stop := func() {
		stopping = true
		_ = signalGroup(w.pgid, sigTerm)
		continueGroup(w.pgid) // a stopped process would not see SIGTERM
		killTimer = time.NewTimer(w.o.killGrace)
		killC = killTimer.C
		// Poll fast for the end of the group from now on.
		pollDelay = groupPoll
		groupT.Stop()
		groupC = nil
	}
	// checkStopped continues the group when a process of it is stopped.
	// Continuing it sends dlock a SIGCHLD of its own, so a group is only
	// taken to be running again when a look at least stopRecheck after the
	// last SIGCONT finds nothing stopped.
	checkStopped := func() {
		if !groupStopped(w.pgid) {
			if time.Since(lastCont) >= stopRecheck {
				restops = 0
			}
			return
		}
		restops++
		switch {
		case stopping:
		case restops > maxRestops:
			end = endStuck
			fmt.Fprintf(w.stderr, "dlock: the command's process group stops again each time it is continued; stopping it: SIGTERM now, SIGKILL in %v\n",
				w.o.killGrace)
			stop()
			return
		case restops == 1:
			fmt.Fprintf(w.stderr, "\ndlock: a command holding %q cannot be suspended; continuing it\n", w.o.name)
		}
		continueGroup(w.pgid)
		lastCont = time.Now()
		recheck.Reset(stopRecheck)
		recheckC = recheck.C
	}
	leaseDone := w.lease.Done()
	for {
		if leaderC == nil {
			// The command's own process is gone; others in its group may
			// not be.
			reapGroup(w.pgid)
			if !groupAlive(w.pgid) {
				return end
			}
			if groupC == nil {
				groupT.Reset(pollDelay)
				groupC = groupT.C
			}
		}
		select {
		case <-leaderC:
			leaderC = nil
			leaderAt = time.Now()
		case <-groupC:
			groupC = nil
			if !stopping {
				pollDelay = min(2*pollDelay, maxGroupPoll)
				if !noted && time.Since(leaderAt) >= lingerNote {
					noted = true
					fmt.Fprintf(w.stderr, "dlock: the command has exited, but processes it started are still running in its "+
						"process group; holding %q until they end\n", w.o.name)
				}
			}
		case sig := <-w.sigs:
			if err := signalGroup(w.pgid, sig); err != nil {
				fmt.Fprintf(w.stderr, "dlock: cannot pass %s on to the command: %v\n", signalName(sig), err)
			}
			if wakesStopped(sig) {
				continueGroup(w.pgid)
			}
		case <-w.stops:
			fmt.Fprintf(w.stderr, "\ndlock: not suspending while holding %q: its lease could lapse while the command runs\n", w.o.name)
		case <-w.chld:
			checkStopped()
		case <-stopTick.C:
			checkStopped()
		case <-recheckC:
			recheckC = nil
			checkStopped()
		case <-leaseDone:
			leaseDone = nil
			end = endLost
			if stopping {
				fmt.Fprintf(w.stderr, "dlock: lost lock %q: %s\n", w.o.name, lossReason(w.lease.Err()))
				break
			}
			fmt.Fprintf(w.stderr, "dlock: lost lock %q: %s; stopping the command: SIGTERM now, SIGKILL in %v\n",
				w.o.name, lossReason(w.lease.Err()), w.o.killGrace)
			stop()
		case <-killC:
			killC = nil
			_ = signalGroup(w.pgid, sigKill)
		}
	}
}

// lossReason says why a lease was lost.
func lossReason(err error) string {
	var lost *dlock.LostError
	if errors.As(err, &lost) {
		if lost.Cause != nil {
			return lost.Reason.String() + " (" + oneLine(lost.Cause.Error()) + ")"
		}
		return lost.Reason.String()
	}
	if err == nil {
		return "unknown reason"
	}
	return oneLine(err.Error())
}

// childEnv is env with the lock's variables set, replacing any already there.
func childEnv(env []string, lease *dlock.Lease, kind lockKind) []string {
	vars := []string{
		"DLOCK_NAME=" + lease.Name(),
		"DLOCK_FENCE=" + strconv.FormatUint(lease.Fence(), 10),
		"DLOCK_OWNER=" + lease.Owner(),
		"DLOCK_KIND=" + kind.String(),
	}
	out := make([]string, 0, len(env)+len(vars))
outer:
	for _, kv := range env {
		for _, v := range vars {
			name, _, _ := strings.Cut(v, "=")
			if strings.HasPrefix(kv, name+"=") {
				continue outer
			}
		}
		out = append(out, kv)
	}
	return append(out, vars...)
}

// startErr is the error of a command that could not be started, with the
// shell's exit codes.
func startErr(name string, err error) *exitError {
	var pe *os.PathError
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, os.ErrNotExist):
		return fail(exitNotFound, "cannot run %q: command not found", name)
	case errors.As(err, &pe):
		return fail(exitCannotExecute, "cannot run %q: %v", name, pe.Err)
	}
	return fail(exitCannotExecute, "cannot run %q: %v", name, err)
}
