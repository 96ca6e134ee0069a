// How dlock run supervises its command while it holds the lock: starting it,
// passing signals on, keeping it from being suspended, stopping it when the
// lease is lost, and waiting for its whole process group.

package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// runHolding runs the command while lease holds the lock, and releases it
// when every process of the command's group has ended.
func runHolding(a *app, o *runOptions, st *store, lease *dlock.Lease, sigs <-chan os.Signal) error {
	cmd := exec.Command(o.command[0], o.command[1:]...)
	cmd.Stdin = os.Stdin
	cmd.Stdout = a.stdout
	cmd.Stderr = a.stderr
	cmd.Env = childEnv(withoutCredentials(os.Environ()), lease, o.kind, o.fair)
	cmd.SysProcAttr = childProcAttr()
	release := func() error { return releaseLease(a, o, lease, sigs) }

	w := &childWatch{stderr: a.msgs(), o: o, lease: lease, sigs: sigs}
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
	held := time.Now()
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
		// A lease lost for want of renewals may still be on the store, until
		// its TTL runs out at most the safety margin from now: one short try
		// to free it sooner, not a wait on a store that does not answer.
		ctx, cancel := context.WithTimeout(context.Background(), lostReleaseTimeout)
		if lease.Unlock(ctx) != nil {
			o.unreleased = true
		}
		cancel()
		return fail(exitLost, "the command %s after the lock %q was lost", how, o.name)
	}
	err = release()
	switch {
	case err == nil && o.verbose:
		fmt.Fprintf(a.msgs(), "dlock: released %q after holding it %s\n", o.name, fmtDuration(time.Since(held)))
	case err == nil:
	case errors.Is(err, dlock.ErrNotHeld):
		return fail(exitLost, "lock %q was lost before the command ended (it %s); the command may have run unprotected at the end",
			o.name, how)
	default:
		fmt.Fprintf(a.msgs(), "dlock: could not release %q; it expires on the store within %v: %s\n",
			o.name, st.expiresWithin(o.ttl), releaseErrText(st, o.name, err))
	}
	if end == endStuck {
		if code == exitOK {
			code = exitSignalBase + signalNumber(sigTerm)
		}
		return fail(code, "the command %s: dlock ended it because it stopped again each time it was continued "+
			"(a process in the background that reads from the terminal is stopped so, by SIGTTIN; COMMAND has "+
			"the terminal only when dlock's stdin is that terminal and dlock is in its foreground)", how)
	}
	if n := code - exitSignalBase; n > 0 && strings.HasPrefix(how, "was killed") && !o.quiet && !w.sent[n] &&
		(sigPipe == nil || n != signalNumber(sigPipe)) {
		// Told apart from a command that exited with that number itself;
		// not for a signal the user sent through dlock, nor SIGPIPE, the
		// quiet end of a pipeline's writer, about which shells say nothing.
		return fail(code, "the command %s (exit status %d)", how, code)
	}
	return &exitError{code: code}
}

// releaseLease releases the lock after the command or the hold has ended:
// bounded like connecting, and cut short by another signal, since a store
// that does not answer lets the lock expire after its TTL anyway. A release
// that failed marks o.unreleased, so that dlock exits without waiting on
// that store again.
func releaseLease(a *app, o *runOptions, lease *dlock.Lease, sigs <-chan os.Signal) error {
	ctx, cancel := context.WithTimeout(context.Background(), min(o.ttl, a.connectTimeout))
	defer cancel()
	// A call stuck on a store that does not answer may not see its context
	// end before its deadline: a second signal does not wait for it, and
	// dlock exits while it is still out.
	done := make(chan error, 1)
	go func() { done <- lease.Unlock(ctx) }()
	var err error
	select {
	case err = <-done:
	case sig := <-sigs:
		cancel()
		err = fmt.Errorf("%s: gave up waiting for the store", signalName(sig))
	}
	if err != nil && !errors.Is(err, dlock.ErrNotHeld) {
		o.unreleased = true
	}
	return err
}

// releaseErrText is the store's error of a failed release of name for a
// message that names the lock: one line, without passwords or the
// library's "dlock: unlock "name": ", which would say the name again.
func releaseErrText(st *store, name string, err error) string {
	msg := strings.TrimPrefix(oneLine(scrub(err.Error(), st.secrets)), "dlock: ")
	return strings.TrimPrefix(msg, fmt.Sprintf("unlock %q: ", name))
}

// holdOnly holds the lock without a command ("dlock run NAME"), for a shell
// script that runs several commands under it: it prints the fence on
// stdout, keeps the lease renewed until a signal comes (SIGINT, SIGTERM,
// SIGHUP, SIGQUIT, SIGUSR1 or SIGUSR2) or its parent process ends (a script
// that died), then releases the lock and exits 0. A lost lock is exit 76:
// the script's commands are not dlock's children, and only the script can
// stop them.
func holdOnly(a *app, o *runOptions, st *store, lease *dlock.Lease, sigs <-chan os.Signal) error {
	parent := startParent
	// A reader that went away must not kill dlock with SIGPIPE while it
	// holds: the write fails instead, and the lock is released.
	pipe := make(chan os.Signal, 1)
	if sigPipe != nil {
		signal.Notify(pipe, sigPipe)
		defer signal.Stop(pipe)
	}
	if _, err := fmt.Fprintln(a.stdout, lease.Fence()); err != nil {
		_ = releaseLease(a, o, lease, sigs)
		return fail(exitIOErr, "cannot write the fence of %q on stdout (%v); released it", o.name, unwrapPathErr(err))
	}
	if !o.quiet {
		fmt.Fprintf(a.msgs(), "dlock: holding %q (fence %d) until a signal; to run a command under it: dlock run NAME -- COMMAND\n",
			o.name, lease.Fence())
	}
	var stops <-chan os.Signal
	if len(suspendSignals) > 0 {
		ch := make(chan os.Signal, 1)
		signal.Notify(ch, suspendSignals...)
		defer signal.Stop(ch)
		stops = ch
	}
	orphan := time.NewTicker(parentPoll)
	defer orphan.Stop()
	held := time.Now()
	end := func(why string) error {
		err := releaseLease(a, o, lease, sigs)
		switch {
		case errors.Is(err, dlock.ErrNotHeld):
			return fail(exitLost, "lock %q was lost before %s ended the hold: %s", o.name, why, lossReason(lease.Err()))
		case err != nil:
			return fail(exitUnavailable, "%s: could not release %q; it expires on the store within %v: %s",
				why, o.name, st.expiresWithin(o.ttl), releaseErrText(st, o.name, err))
		case o.verbose:
			fmt.Fprintf(a.msgs(), "dlock: %s: released %q after holding it %s\n", why, o.name, fmtDuration(time.Since(held)))
		}
		return nil
	}
	for {
		select {
		case <-lease.Done():
			return fail(exitLost, "lost lock %q: %s", o.name, lossReason(lease.Err()))
		case <-stops:
			fmt.Fprintf(a.msgs(), "dlock: not suspending while holding %q: its lease could lapse\n", o.name)
		case <-pipe:
		case <-orphan.C:
			if os.Getppid() != parent {
				return end("the process that started dlock ended")
			}
		case sig := <-sigs:
			return end(signalName(sig))
		}
	}
}

// startParent is dlock's parent process as dlock started: a hold granted
// after its parent ended (the script died while dlock waited for the lock)
// sees the end, where a parent read at the grant would already be the
// process that adopted dlock.
var startParent = os.Getppid()

// parentPoll is how often a hold without a command looks for the end of
// its parent.
const parentPoll = 500 * time.Millisecond

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

// lostReleaseTimeout bounds the release of a lease that was lost while the
// command ran: the store that let it lapse may not answer, and dlock exits
// as soon as the command has ended and the loss is reported.
const lostReleaseTimeout = 250 * time.Millisecond

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
	sent   map[int]bool     // the signals passed on to the group, by number
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
			if w.sent == nil {
				w.sent = make(map[int]bool)
			}
			w.sent[signalNumber(sig)] = true
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
func childEnv(env []string, lease *dlock.Lease, kind lockKind, fair bool) []string {
	vars := []string{
		"DLOCK_NAME=" + lease.Name(),
		"DLOCK_FENCE=" + strconv.FormatUint(lease.Fence(), 10),
		"DLOCK_OWNER=" + lease.Owner(),
		"DLOCK_KIND=" + kind.String(),
		"DLOCK_FAIR=1", // last: left out, yet removed from env, unless fair
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
	if !fair {
		vars = vars[:len(vars)-1]
	}
	return append(out, vars...)
}

// startErr is the error of a command that could not be started, with the
// shell's exit codes. A file that exists but is missing what it needs to
// start (the interpreter of its #! line: "/bin/sh\r" after a Windows line
// end) is not "command not found", nor a directory "permission denied".
func startErr(name string, err error) *exitError {
	var pe *os.PathError
	switch {
	case errors.Is(err, exec.ErrNotFound), errors.Is(err, os.ErrNotExist):
		path := name
		if !strings.Contains(name, "/") {
			p, lerr := exec.LookPath(name)
			if lerr != nil {
				return fail(exitNotFound, "cannot run %q: command not found", name)
			}
			path = p
		}
		if _, serr := os.Stat(path); serr != nil {
			return fail(exitNotFound, "cannot run %q: no such file", name)
		}
		if interp, ok := shebang(path); ok {
			return fail(exitNotFound, "cannot run %q: its #! line names the interpreter %q, which was not found", name, interp)
		}
		return fail(exitNotFound, "cannot run %q: a file it needs to start (its loader or a library) was not found", name)
	case errors.As(err, &pe):
		if fi, serr := os.Stat(name); serr == nil && fi.IsDir() {
			return fail(exitCannotExecute, "cannot run %q: is a directory", name)
		}
		return fail(exitCannotExecute, "cannot run %q: %v", name, pe.Err)
	}
	return fail(exitCannotExecute, "cannot run %q: %v", name, err)
}

// shebang returns the interpreter the #! line of the file at path names,
// as the kernel reads it: up to the first blank or line end, so that a
// carriage return stays part of it.
func shebang(path string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	buf := make([]byte, 256)
	n, _ := f.Read(buf)
	line, ok := strings.CutPrefix(string(buf[:n]), "#!")
	if !ok {
		return "", false
	}
	line, _, _ = strings.Cut(line, "\n")
	fields := strings.FieldsFunc(line, func(r rune) bool { return r == ' ' || r == '\t' })
	if len(fields) == 0 {
		return "", false
	}
	return fields[0], true
}
