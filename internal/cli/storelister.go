// storeLister: the store access of top and dash, which watch a store that
// may not exist yet.

package cli

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/dash"
)

// storeLister lists a store's held locks through its Inspector, for the
// commands that watch a store (top, dash). A SQLite file that does not
// exist yet holds no lock: it lists nothing, is not created, and is looked
// for again at the next call. List, breakIf and inspect may be called
// concurrently (dash's sampler and its release button); open and Close
// may not.
type storeLister struct {
	a      *app
	prefix string
	mu     sync.Mutex // guards st and in after open, for List, breakIf and inspect
	st     *store
	in     driver.Inspector
	where  string
}

// open opens the store, or finds that its SQLite file does not exist yet;
// any other error (a bad URL, a store that cannot be reached, one without
// an Inspector) is returned, to end the command.
func (l *storeLister) open(ctx context.Context) error {
	st, in, err := l.a.openInspector(ctx)
	var noStore *noStoreError
	switch {
	case errors.As(err, &noStore):
		l.where = "SQLite file " + noStore.path // as the store names itself once open
		return nil
	case err != nil:
		return err
	}
	l.st, l.in, l.where = st, in, st.where
	return nil
}

// List returns the held locks under the prefix. Its errors name the store,
// with secrets redacted.
func (l *storeLister) List(ctx context.Context) ([]driver.LockInfo, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.in == nil {
		if err := l.open(ctx); err != nil {
			return nil, err
		}
		if l.in == nil {
			return nil, nil
		}
	}
	infos, err := l.in.List(ctx, l.prefix)
	if err != nil {
		return nil, l.st.storeErr("list locks", err)
	}
	return infos, nil
}

// notifier returns the store's release notifications, or nil when it has
// none or is not open yet, for dash (dash.Config.Notifier).
func (l *storeLister) notifier() driver.Notifier {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st == nil {
		return nil
	}
	n, _ := l.st.backend.(driver.Notifier)
	return n
}

// breakIf breaks the exclusive hold of key if its grant's fence is still
// fence and it has no lock-delay (driver.Breaker), for dash's release
// button: a lock that changed hands since the page showed it keeps its new
// holder. broken is false when it did not (or the store does not exist
// yet); a store without BreakIf gets an error wrapping dash.ErrNoBreaker,
// never a blind ForceRelease.
func (l *storeLister) breakIf(ctx context.Context, key string, fence uint64) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.in == nil {
		return false, nil
	}
	br, ok := l.st.backend.(driver.Breaker)
	if !ok {
		return false, fmt.Errorf("%s: %w", l.st.where, dash.ErrNoBreaker)
	}
	broken, err := br.BreakIf(ctx, key, fence)
	if err != nil {
		return false, l.st.storeErr("release "+key, err)
	}
	return broken, nil
}

// inspect describes the lock of key, for dash's answer to a release that
// broke nothing.
func (l *storeLister) inspect(ctx context.Context, key string) (driver.LockInfo, bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.in == nil {
		return driver.LockInfo{}, false, nil
	}
	info, ok, err := l.in.Inspect(ctx, key)
	if err != nil {
		return info, ok, l.st.storeErr("inspect "+key, err)
	}
	return info, ok, nil
}

// canBreak reports whether the store, once open, can break a lock on
// condition of its grant (driver.Breaker); a SQLite store not created yet
// will (sqllock has BreakIf).
func (l *storeLister) canBreak() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.st == nil {
		return true
	}
	_, ok := l.st.backend.(driver.Breaker)
	return ok
}

// Close closes the store, if it was opened.
func (l *storeLister) Close() {
	if l.st != nil {
		l.st.Close()
	}
}

// heldForFunc and fmtDurationFunc hand the CLI's own measures to the views.
var (
	heldForFunc     func(driver.LockInfo, time.Time) (time.Duration, bool) = heldFor
	fmtDurationFunc func(time.Duration) string                             = fmtDuration
)
