// What dlock run shows while it waits: what keeps the lock from the user,
// and a live line on a terminal.

package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/safetext"
)

// liveInterval is how often the live line on a terminal is redrawn.
const liveInterval = 200 * time.Millisecond

// liveCheckInterval is how often a waiter checks again whether the holder
// it waits for, a process of this host, has ended: a dead holder's lock
// brings no new answer from the store until its lease expires.
const liveCheckInterval = 500 * time.Millisecond

// inspectTimeout bounds the store call that finds how long the holder has
// held the lock, for a message.
const inspectTimeout = time.Second

// waitReporter tells a waiting user what keeps the lock from them (its
// holder, readers, permits in use, a waiting writer, their place in a fair
// queue): once, and again when that changes. On a terminal it also keeps a
// live line with the time waited, redrawn in place with '\r'. It runs in a
// goroutine of its own, so that the lock's WithOnBusy hook never blocks.
type waitReporter struct {
	w           io.Writer
	tty         bool
	name        string
	kind        lockKind
	fair        bool          // --fair, of any kind: it has a place to show
	permits     int           // --semaphore N
	wait        time.Duration // --wait; waitForever for no limit
	quietOnDead bool          // --take-over-dead: the takeover says it
	store       *store
	start       time.Time

	updates chan *dlock.NotObtainedError // capacity 1: the latest answer
	stop    chan struct{}
	done    chan struct{}

	liveLen int // width of the live line on screen, 0 when none
}

func startWaitReporter(w io.Writer, o *runOptions, st *store) *waitReporter {
	r := &waitReporter{
		w:           w,
		tty:         isTerminal(w),
		name:        o.name,
		kind:        o.kind,
		fair:        o.fair,
		permits:     o.permits,
		wait:        o.wait,
		quietOnDead: o.takeOver,
		store:       st,
		start:       time.Now(),
		updates:     make(chan *dlock.NotObtainedError, 1),
		stop:        make(chan struct{}),
		done:        make(chan struct{}),
	}
	go r.loop()
	return r
}

// busy is the WithOnBusy hook: it hands the store's answer to the loop,
// replacing an answer the loop has not taken yet. Only one goroutine calls
// it at a time.
func (r *waitReporter) busy(e *dlock.NotObtainedError) { offerLatest(r.updates, e) }

// offerLatest puts e in ch, a channel of capacity 1, replacing an answer
// its reader has not taken yet; it never blocks. The WithOnBusy hooks of
// the wait reporter and the takeover watch hand their loops the latest
// answer this way.
func offerLatest(ch chan *dlock.NotObtainedError, e *dlock.NotObtainedError) {
	for {
		select {
		case ch <- e:
			return
		default:
		}
		select {
		case <-ch:
		default:
		}
	}
}

// Stop clears the live line and ends the loop.
func (r *waitReporter) Stop() {
	close(r.stop)
	<-r.done
}

func (r *waitReporter) loop() {
	defer close(r.done)
	var tick <-chan time.Time
	if r.tty {
		t := time.NewTicker(liveInterval)
		defer t.Stop()
		tick = t.C
	}
	liveCheck := time.NewTicker(liveCheckInterval)
	defer liveCheck.Stop()
	var (
		last     string // waitState of the last message
		lastPos  int    // the place in the queue it gave
		seen     bool
		latest   *dlock.NotObtainedError
		saidDead string // the dead holder already announced
	)
	for {
		select {
		case <-liveCheck.C:
			saidDead = r.sayDead(latest, saidDead)
		case e := <-r.updates:
			latest = e
			state, pos := waitState(e), r.place(e)
			if seen && state == last && pos == lastPos {
				continue
			}
			line := r.describe(e, seen && state != last, seen && pos != lastPos)
			seen, last, lastPos = true, state, pos
			r.clearLive()
			fmt.Fprintf(r.w, "dlock: %s\n", line)
			r.drawLive()
			saidDead = r.sayDead(e, saidDead)
		case <-tick:
			r.drawLive()
		case <-r.stop:
			r.clearLive()
			return
		}
	}
}

// sayDead says once that e's exclusive holder, a process of this host,
// has ended (its lock stays on the store until its lease expires), unless
// it was said already or --take-over-dead will say it; it returns the
// holder announced so far.
func (r *waitReporter) sayDead(e *dlock.NotObtainedError, said string) string {
	if r.quietOnDead || e == nil || e.Shared > 0 || e.WriterWaiting || e.Holder == "" || e.Holder == said || !deadHolder(e.Holder) {
		return said
	}
	r.clearLive()
	fmt.Fprintf(r.w, "dlock: %q: its holder's process has ended on this host; its lock stays until its lease expires (--take-over-dead takes such a lock over at once)\n", r.name)
	r.drawLive()
	return e.Holder
}

// waitState is what keeps the lock from the waiter, for a new message when
// it changes: the holder of an exclusive lock, the waiting writer, the
// number of shared holds (not which of them expires first or last, which
// changes with every renewal).
func waitState(e *dlock.NotObtainedError) string {
	switch {
	case e.WriterWaiting:
		return "writer\x00" + waiterKey(e.Holder)
	case e.Shared > 0:
		return "shared\x00" + strconv.Itoa(e.Shared)
	}
	return "holder\x00" + e.Holder
}

// waiterKey is a waiting writer's owner string without its time, which
// names the second of the writer's latest attempt: the same writer trying
// again is no new writer.
func waiterKey(owner string) string {
	o, ok := splitOwner(owner)
	if !ok {
		return owner
	}
	key := o.host + "|pid " + o.pid + "|" + o.tag
	if o.metadata != nil {
		key += "|" + *o.metadata
	}
	return key
}

// place is the waiter's place in the fair queue that a message gives, or 0.
// Only a --fair run (of any kind) has one to show: a plain waiter that
// dlock has queued, so that it is not starved, is in the same queue, but it
// asked for no order, and its place would only puzzle the user.
func (r *waitReporter) place(e *dlock.NotObtainedError) int {
	if !r.fair {
		return 0
	}
	return e.Position
}

// describe says what keeps the lock from the waiter, and for how long it
// waits. holderChanged and placeChanged mark what changed since the last
// message.
func (r *waitReporter) describe(e *dlock.NotObtainedError, holderChanged, placeChanged bool) string {
	var b strings.Builder
	what, afterIs := r.obstacle(e, holderChanged)
	if afterIs {
		fmt.Fprintf(&b, "%q is %s", r.name, what)
	} else {
		fmt.Fprintf(&b, "%q: %s", r.name, what)
	}
	if pos := r.place(e); pos > 0 {
		b.WriteString("; ")
		if placeChanged {
			b.WriteString("now ")
		}
		fmt.Fprintf(&b, "%s in the queue", ordinal(pos))
	}
	b.WriteString("; ")
	switch {
	case holderChanged || placeChanged:
		b.WriteString("still waiting")
	case r.wait == waitForever:
		b.WriteString("waiting until it is free")
	default:
		fmt.Fprintf(&b, "waiting up to %s", r.wait)
	}
	return b.String()
}

// obstacle describes what e says keeps the lock from the caller, without
// the lock's name. When afterIs, it reads after "NAME is": "held by OWNER
// (held for 3.0s, expires in 7.0s)" for an exclusive holder (or none
// known), "free, but ..." for a fair lock with waiters queued; else after
// "NAME:": "a writer is waiting (owner OWNER), ..." for a reader, "5 of 5 permits in use
// (...)" or "2 readers hold it (...)". now marks a change since the last
// message. A reporter that waits says when the holder's expiry is unknown;
// the final message (wait 0) leaves that out.
func (r *waitReporter) obstacle(e *dlock.NotObtainedError, now bool) (what string, afterIs bool) {
	var b strings.Builder
	if now {
		b.WriteString("now ")
	}
	switch {
	case e.WriterWaiting && (r.kind == lockExclusive || r.kind == lockFair):
		// An exclusive request is kept out of a free lock by an earlier
		// waiter's claim or intent on its next grant.
		fmt.Fprintf(&b, "free, but kept for a waiter ahead of this one (owner %s)", holderText(e.Holder))
		return b.String(), true
	case e.WriterWaiting:
		who := "readers"
		if r.kind == lockSemaphore {
			who = "permit holders"
		}
		fmt.Fprintf(&b, "a writer is waiting (owner %s), and %s let it go first", holderText(e.Holder), who)
		return b.String(), false
	case e.Shared > 0 && r.kind == lockSemaphore:
		permits := e.Permits
		if permits == 0 {
			permits = r.permits
		}
		fmt.Fprintf(&b, "%d of %d permits in use", e.Shared, permits)
		if e.HolderTTL > 0 {
			fmt.Fprintf(&b, " (next expires in %s)", fmtDuration(e.HolderTTL))
		}
		if r.fair && e.Shared < permits {
			b.WriteString(queuedAhead)
		}
		return b.String(), false
	case e.Shared > 0:
		// A writer waits for every shared hold: readers, or the permits of
		// a semaphore of the same name.
		info, ok := r.inspect()
		switch {
		case ok && info.Limit > 0:
			fmt.Fprintf(&b, "%d of %d permits in use", e.Shared, info.Limit)
		case e.Shared == 1:
			b.WriteString("1 reader holds it")
		default:
			fmt.Fprintf(&b, "%d readers hold it", e.Shared)
		}
		if e.HolderTTL > 0 {
			fmt.Fprintf(&b, " (the last expires in %s)", fmtDuration(e.HolderTTL))
		}
		if r.fair && r.kind == lockShared {
			// Readers let a reader in: what keeps it out is the queue.
			b.WriteString(queuedAhead)
		}
		return b.String(), false
	case e.Holder == "" && r.fair:
		// A fair attempt that does not wait yields to the waiters queued
		// ahead of it, even when the lock is free.
		if info, ok := r.inspect(); !ok || info.Owner == "" {
			b.WriteString("free, but others are queued for it (a fair lock goes to them first)")
			return b.String(), true
		}
	}
	fmt.Fprintf(&b, "held by %s", holderText(e.Holder))
	var details []string
	if d, ok := r.holderHeldFor(e.Holder); ok && e.Holder != "" {
		details = append(details, "held for "+fmtDuration(d))
	}
	if e.HolderTTL > 0 {
		details = append(details, "expires in "+fmtDuration(e.HolderTTL))
	} else if r.wait != 0 {
		details = append(details, "expiry unknown")
	}
	if len(details) > 0 {
		fmt.Fprintf(&b, " (%s)", strings.Join(details, ", "))
	}
	return b.String(), true
}

// queuedAhead ends the message of a fair reader or permit that the holds
// alone would let in: it waits for those queued before it.
const queuedAhead = ", and others are queued ahead (a fair lock goes to them first)"

// inspect asks the store about the lock, for a message; ok is false when it
// is not held or the store cannot tell.
func (r *waitReporter) inspect() (driver.LockInfo, bool) {
	if r.store == nil || r.store.inspector == nil {
		return driver.LockInfo{}, false
	}
	ctx, cancel := context.WithTimeout(context.Background(), inspectTimeout)
	defer cancel()
	info, ok, err := r.store.inspector.Inspect(ctx, r.name)
	return info, ok && err == nil
}

// holderHeldFor asks the store how long holder has held the lock, and falls
// back on the time in the owner string.
func (r *waitReporter) holderHeldFor(holder string) (time.Duration, bool) {
	info := driver.LockInfo{Key: r.name, Owner: holder}
	if got, ok := r.inspect(); ok && got.Owner == holder {
		info = got
	}
	return heldFor(info, time.Now())
}

// ordinal spells n as 1st, 2nd, 3rd, 4th, ..., 11th, 12th, 13th, 21st.
func ordinal(n int) string {
	suffix := "th"
	switch n % 10 {
	case 1:
		suffix = "st"
	case 2:
		suffix = "nd"
	case 3:
		suffix = "rd"
	}
	if n%100 >= 11 && n%100 <= 13 {
		suffix = "th"
	}
	return strconv.Itoa(n) + suffix
}

func (r *waitReporter) drawLive() {
	if !r.tty {
		return
	}
	s := fmt.Sprintf("dlock: waiting for %q... %s", r.name, fmtDuration(time.Since(r.start)))
	pad := max(r.liveLen-len(s), 0)
	fmt.Fprintf(r.w, "\r%s%s", s, strings.Repeat(" ", pad))
	r.liveLen = len(s)
}

func (r *waitReporter) clearLive() {
	if r.liveLen == 0 {
		return
	}
	fmt.Fprintf(r.w, "\r%s\r", strings.Repeat(" ", r.liveLen))
	r.liveLen = 0
}

// holderText is the owner string for a message, escaped (see safetext):
// another program wrote it.
func holderText(owner string) string {
	if owner == "" {
		return "an unknown owner"
	}
	return safetext.Escape(owner)
}

// isTerminal reports whether w is a terminal (a character device).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}
