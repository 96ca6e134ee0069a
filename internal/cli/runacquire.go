// How dlock run takes its lock: connecting, checking what the store can do,
// waiting (ended by a signal) and saying why the lock was not obtained.

package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

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

	st, err := a.openFor(ctx, o.refuseUnsupported)
	if err != nil {
		if sig := stopWatch(); sig != nil {
			return nil, nil, nil, interrupted(o.name, sig)
		}
		return nil, nil, nil, err
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
	// Where dlock says that it took over a dead holder's lock: not with
	// -q, nor with -E 0, where a busy lock is a silent success.
	var say io.Writer = a.msgs()
	if o.quiet || (o.conflictCode == exitOK && !o.verbose) {
		say = nil
	}
	started := time.Now()
	var tookFrom string // the dead holder taken over
	if o.wait == 0 {
		lease, err = o.take(c, opts, false)(ctx)
		var no *dlock.NotObtainedError
		if o.takeOver && errors.As(err, &no) && no.Shared == 0 && !no.WriterWaiting && takeOver(st, o.name, no.Holder) {
			tookFrom = no.Holder
			lease, err = o.take(c, opts, false)(ctx)
		}
	} else {
		if say != nil {
			// With -E 0 a busy lock is a silent success: no wait
			// messages either, or cron would mail them.
			rep = startWaitReporter(a.msgs(), o, st)
		}
		var tk *takeoverWatch
		if o.takeOver {
			tk = startTakeoverWatch(st, o.name)
		}
		opts = append(opts, dlock.WithOnBusy(func(e *dlock.NotObtainedError) {
			if rep != nil {
				rep.busy(e)
			}
			if tk != nil {
				tk.busy(e)
			}
		}))
		if o.wait != waitForever {
			opts = append(opts, dlock.WithWait(o.wait))
		}
		lease, err = o.take(c, opts, true)(ctx)
		if tk != nil {
			tk.Stop()
			tookFrom = tk.took
		}
		if rep != nil {
			rep.Stop()
		}
	}
	sig := stopWatch()
	sayTakenOver(say, o.name, tookFrom, lease)
	switch {
	case err == nil && sig != nil:
		// Obtained just as the signal came: give it back unused.
		uctx, ucancel := context.WithTimeout(context.Background(), a.connectTimeout)
		_ = lease.Unlock(uctx)
		ucancel()
		closeAll()
		return nil, nil, nil, interrupted(o.name, sig)
	case err == nil:
		if o.verbose {
			fmt.Fprintf(a.msgs(), "dlock: got %q (fence %d) after waiting %s\n", o.name, lease.Fence(), fmtDuration(time.Since(started)))
		}
		return lease, st, c, nil
	}
	defer closeAll()
	var notObtained *dlock.NotObtainedError
	switch {
	case sig != nil:
		return nil, nil, nil, interrupted(o.name, sig)
	case errors.Is(err, dlock.ErrConflict):
		// No flag is wrong on its own: the name is held as another kind.
		return nil, nil, nil, fail(exitUsage, "%s", strings.TrimPrefix(err.Error(), "dlock: "))
	case errors.Is(err, dlock.ErrInvalid):
		return nil, nil, nil, usageErr("run", "%s", strings.TrimPrefix(err.Error(), "dlock: invalid argument: "))
	case errors.As(err, &notObtained):
		return nil, nil, nil, notObtainedErr(st, o, notObtained)
	}
	return nil, nil, nil, st.libErr(fmt.Sprintf("lock %q", o.name), err)
}

// take returns the call that takes the lock of o's kind from c: the one
// that waits (subject to WithWait among opts) when wait is set, else the one
// that tries once.
func (o *runOptions) take(c *dlock.Client, opts []dlock.Option, wait bool) func(context.Context) (*dlock.Lease, error) {
	if o.fair {
		opts = append(opts, dlock.Fair())
	}
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
	}
	m := c.Mutex(o.name, append(opts, dlock.WithLockDelay(o.lockDelay))...)
	if wait {
		return m.Lock
	}
	return m.TryLock
}

// refuseUnsupported refuses, as a usage error, a run that asks be for what
// it does not keep: a lock-delay, or the kind of lock of o's flags. It is
// vetted before the store is reached, so that the answer does not depend on
// whether the store is up.
func (o *runOptions) refuseUnsupported(be driver.Backend, where string) error {
	cb, ok := be.(driver.Capabler)
	if o.lockDelay > 0 && (!ok || !cb.Supports(driver.CapLockDelay)) {
		return usageErr("run", "--lock-delay needs a Redis or Redlock backend; %s keeps no lock-delay", where)
	}
	for _, cp := range o.needs() {
		if !ok || !cb.Supports(cp) {
			return usageErr("run", "%s needs a store with %s; %s has none (%s)", o.kindFlags(), cp, where, storesWith(cp))
		}
	}
	return nil
}

// storesWith says which of the stores dlock reaches have cp, for a message
// refusing a kind of lock.
func storesWith(cp driver.Capability) string {
	if cp == driver.CapFairShared {
		return "Redis has them: redis://, rediss://, redis+sentinel://, redis+cluster://"
	}
	return "the SQL, Redis and etcd stores have them"
}

// notObtainedErr is exit 75 (or --conflict-exit-code), saying what stood
// in the way unless --quiet.
func notObtainedErr(st *store, o *runOptions, e *dlock.NotObtainedError) *exitError {
	code := o.conflictCode
	if o.quiet || (code == exitOK && !o.verbose) {
		// --conflict-exit-code 0 makes a busy lock a success, as flock
		// -E 0 does: said only with --verbose, so cron mails nothing.
		return &exitError{code: code}
	}
	r := &waitReporter{name: o.name, kind: o.kind, fair: o.fair, permits: o.permits, store: st}
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
	if !o.takeOver && e.Shared == 0 && !e.WriterWaiting && deadHolder(e.Holder) {
		b.WriteString("; its process has ended on this host (--take-over-dead takes such a lock over)")
	}
	if o.wait == 0 {
		b.WriteString("; not waiting (--wait 0)")
	}
	return fail(code, "%s", b.String())
}
