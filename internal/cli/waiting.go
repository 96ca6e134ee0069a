package cli

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
)

// liveInterval is how often the live line on a terminal is redrawn.
const liveInterval = 200 * time.Millisecond

// inspectTimeout bounds the store call that finds how long the holder has
// held the lock, for a message.
const inspectTimeout = time.Second

// waitReporter tells a waiting user who holds the lock: once, and again when
// the holder changes. On a terminal it also keeps a live line with the time
// waited, redrawn in place with '\r'. It runs in a goroutine of its own, so
// that the lock's WithOnBusy hook never blocks.
type waitReporter struct {
	w     io.Writer
	tty   bool
	name  string
	wait  time.Duration // --wait; waitForever for no limit
	store *store
	start time.Time

	updates chan *dlock.NotObtainedError // capacity 1: the latest answer
	stop    chan struct{}
	done    chan struct{}

	liveLen int // width of the live line on screen, 0 when none
}

func startWaitReporter(w io.Writer, name string, wait time.Duration, st *store) *waitReporter {
	r := &waitReporter{
		w:       w,
		tty:     isTerminal(w),
		name:    name,
		wait:    wait,
		store:   st,
		start:   time.Now(),
		updates: make(chan *dlock.NotObtainedError, 1),
		stop:    make(chan struct{}),
		done:    make(chan struct{}),
	}
	go r.loop()
	return r
}

// busy is the WithOnBusy hook: it hands the store's answer to the loop,
// replacing an answer the loop has not taken yet. Only one goroutine calls
// it at a time.
func (r *waitReporter) busy(e *dlock.NotObtainedError) {
	for {
		select {
		case r.updates <- e:
			return
		default:
		}
		select {
		case <-r.updates:
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
	var holder string
	seen := false
	for {
		select {
		case e := <-r.updates:
			if seen && e.Holder == holder {
				continue
			}
			line := r.describe(e, seen)
			seen, holder = true, e.Holder
			r.clearLive()
			fmt.Fprintf(r.w, "dlock: %s\n", line)
			r.drawLive()
		case <-tick:
			r.drawLive()
		case <-r.stop:
			r.clearLive()
			return
		}
	}
}

// describe says who holds the lock, for how long and until when.
func (r *waitReporter) describe(e *dlock.NotObtainedError, changed bool) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%q is ", r.name)
	if changed {
		b.WriteString("now ")
	}
	b.WriteString("held by ")
	b.WriteString(holderText(e.Holder))
	b.WriteString(" (")
	if d, ok := r.holderHeldFor(e.Holder); ok {
		fmt.Fprintf(&b, "held for %s, ", fmtDuration(d))
	}
	if e.HolderTTL > 0 {
		fmt.Fprintf(&b, "expires in %s", fmtDuration(e.HolderTTL))
	} else {
		b.WriteString("expiry unknown")
	}
	b.WriteString("); ")
	switch {
	case changed:
		b.WriteString("still waiting")
	case r.wait == waitForever:
		b.WriteString("waiting until it is free")
	default:
		fmt.Fprintf(&b, "waiting up to %s", r.wait)
	}
	return b.String()
}

// holderHeldFor asks the store how long holder has held the lock, and falls
// back on the time in the owner string.
func (r *waitReporter) holderHeldFor(holder string) (time.Duration, bool) {
	info := driver.LockInfo{Key: r.name, Owner: holder}
	if r.store != nil && r.store.inspector != nil {
		ctx, cancel := context.WithTimeout(context.Background(), inspectTimeout)
		got, ok, err := r.store.inspector.Inspect(ctx, r.name)
		cancel()
		if err == nil && ok && got.Owner == holder {
			info = got
		}
	}
	return heldFor(info, time.Now())
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

// holderText is the owner string for a message.
func holderText(owner string) string {
	if owner == "" {
		return "an unknown owner"
	}
	return owner
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
