// Taking over the lock of a holder that has ended on this host, as flock
// frees a crashed holder's lock at once: its owner string names its
// process, which dlock checks, and the lock is broken only while it is
// still that holder's grant (driver.Breaker).

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
	"github.com/dlock-go/dlock/internal/proclive"
)

// takeoverTimeout bounds the store calls of one takeover.
const takeoverTimeout = 2 * time.Second

// deadHolder reports whether owner, an exclusive holder's owner string, was
// written by a process of this host that has ended.
func deadHolder(owner string) bool {
	o, ok := splitOwner(owner)
	if !ok || o.tag == "" {
		return false
	}
	host, err := os.Hostname()
	if err != nil || host != o.host {
		return false
	}
	pid, _, _ := strings.Cut(o.pid, " client ")
	n, err := strconv.Atoi(pid)
	return err == nil && proclive.Dead(n, o.tag)
}

// takeOver breaks the lock name when its exclusive holder is holder, a
// process of this host that has ended; it reports whether it did. The
// fence read by Inspect names the grant: if the lock changed hands since,
// BreakIf finds another fence and does nothing.
func takeOver(st *store, name, holder string) bool {
	br, ok := st.backend.(driver.Breaker)
	if !ok || st.inspector == nil || holder == "" || !deadHolder(holder) {
		return false
	}
	ctx, cancel := context.WithTimeout(context.Background(), takeoverTimeout)
	defer cancel()
	info, held, err := st.inspector.Inspect(ctx, name)
	// Several holds of one grant: an owner ID shared by processes, whose
	// re-entries keep the first one's owner string; the others may live.
	if err != nil || !held || info.Owner != holder || info.Holds > 1 {
		return false
	}
	broken, err := br.BreakIf(ctx, name, info.Fence)
	return err == nil && broken
}

// sayTakenOver says on w (nil: silently) that the lock name of holder, a
// dead process, was broken; lease is the lock then obtained, or nil.
func sayTakenOver(w io.Writer, name, holder string, lease *dlock.Lease) {
	switch {
	case w == nil || holder == "":
	case lease != nil:
		fmt.Fprintf(w, "dlock: %q was held by %s, whose process has ended on this host; took its lock over (fence %d)\n",
			name, holderText(holder), lease.Fence())
	default:
		fmt.Fprintf(w, "dlock: %q was held by %s, whose process has ended on this host; broke its lock\n",
			name, holderText(holder))
	}
}

// takeoverWatch takes over, in a goroutine of its own, from the dead
// holders that a waiting Lock's refusals name (WithOnBusy), each once.
type takeoverWatch struct {
	st      *store
	name    string
	took    string                       // the holder taken over, read after Stop
	answers chan *dlock.NotObtainedError // capacity 1: the latest answer
	stop    chan struct{}
	done    chan struct{}
}

func startTakeoverWatch(st *store, name string) *takeoverWatch {
	t := &takeoverWatch{st: st, name: name, answers: make(chan *dlock.NotObtainedError, 1),
		stop: make(chan struct{}), done: make(chan struct{})}
	go t.loop()
	return t
}

// busy hands an answer to the loop, replacing one it has not taken yet; it
// never blocks.
func (t *takeoverWatch) busy(e *dlock.NotObtainedError) { offerLatest(t.answers, e) }

// Stop ends the loop and waits for it.
func (t *takeoverWatch) Stop() {
	close(t.stop)
	<-t.done
}

func (t *takeoverWatch) loop() {
	defer close(t.done)
	tried := make(map[string]bool)
	// A holder still alive may end later, with no new answer from the
	// store: the latest one's holder is checked again each
	// liveCheckInterval. Only a dead one is tried, and once.
	liveCheck := time.NewTicker(liveCheckInterval)
	defer liveCheck.Stop()
	var latest *dlock.NotObtainedError
	for {
		select {
		case latest = <-t.answers:
		case <-liveCheck.C:
		case <-t.stop:
			return
		}
		e := latest
		if e == nil || e.Shared > 0 || e.WriterWaiting || tried[e.Holder] || !deadHolder(e.Holder) {
			continue
		}
		tried[e.Holder] = true
		if takeOver(t.st, t.name, e.Holder) {
			t.took = e.Holder
		}
	}
}
