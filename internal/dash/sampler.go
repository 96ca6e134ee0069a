// Package dash is the web dashboard of dlock dash: a sampler that lists one
// store's held locks at an interval and derives from successive samples the
// grants, releases and losses it saw, and an http.Handler that serves the
// page (its assets embedded), the samples as JSON and store-level gauges in
// the Prometheus text format. It only reads the store. The dlock command
// wires it (internal/cli/dash.go).
package dash

import (
	"context"
	"encoding/hex"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/safetext"
)

// Config is what a Dash needs besides the store.
type Config struct {
	// List returns the store's held locks (driver.Inspector.List with a
	// prefix applied). Only the sampler's goroutine calls it.
	List func(ctx context.Context) ([]driver.LockInfo, error)
	// HeldFor tells how long a hold has been held (the store's measure or
	// the owner string's time), ok false when unknown.
	HeldFor func(info driver.LockInfo, now time.Time) (d time.Duration, ok bool)
	// Where names the store on the page (already redacted).
	Where string
	// Interval is the time between two samples; 0 means 250ms.
	Interval time.Duration
	// Window is how far back the timeline goes; 0 means 5 minutes.
	Window time.Duration
	// Release, when set, breaks the exclusive hold of key if its grant's
	// fence is fence and it has no lock-delay (driver.Breaker.BreakIf), for
	// the page's force-release button, and reports whether it did; it
	// returns an error wrapping ErrNoBreaker for a store that cannot.
	// ReleaseToken is the secret a request must carry (Authorization:
	// Bearer TOKEN). Both or neither: without them the dashboard is
	// read-only. Inspect (driver.Inspector.Inspect), optional, tells why a
	// release broke nothing.
	Release      func(ctx context.Context, key string, fence uint64) (broken bool, err error)
	ReleaseToken string
	Inspect      func(ctx context.Context, key string) (info driver.LockInfo, held bool, err error)
	// Notifier, when set, returns the store's release notifications
	// (driver.Notifier), or nil while it has none (a store not open yet):
	// Run subscribes to the locks it saw held and samples at once when
	// one is released, besides every Interval.
	Notifier func() driver.Notifier
}

// Dash samples a store and serves what it saw. Its methods are safe for
// concurrent use.
type Dash struct {
	cfg Config

	mu       sync.Mutex
	state    State
	holds    map[holdID]holdSeen // the holds of the last good sample
	sampled  bool                // a sample has succeeded: holds is the baseline
	timeline []Bucket            // one per second, oldest first, at most Window/1s
	counts   Counts

	notifying atomic.Bool // State.Notifications, set by Run's watcher

	lastSample time.Time // when Run's last sample ended; Run's alone
}

// holdID tells one grant apart from every other: the lock's name and the
// grant's fence (every grant of a name has a fence of its own).
type holdID struct {
	key   string
	fence uint64
}

type holdSeen struct {
	ttl     time.Duration
	delayed bool
}

// Counts are the sampler's running totals since it started.
type Counts struct {
	Samples      uint64 `json:"samples"`
	SampleErrors uint64 `json:"sample_errors"`
	Grants       uint64 `json:"grants"`
	Releases     uint64 `json:"releases"`
	Losses       uint64 `json:"losses"`
	// Wakeups are the samples taken at once because the store announced
	// a release (Config.Notifier), besides those every interval.
	Wakeups uint64 `json:"wakeups"`
}

// Bucket is one second of the timeline: the events seen in it, and the
// most locks held and waiters queued at one sample in it.
type Bucket struct {
	Unix     int64 `json:"t"`
	Grants   int   `json:"grants"`
	Releases int   `json:"releases"`
	Losses   int   `json:"losses"`
	Held     int   `json:"held"`
	Queued   int   `json:"queued"`
}

// State is the last sample, as /api/state serves it. Every string that
// came from the store is escaped (safetext.Escape): control and bidi
// characters are shown as Go escapes; the page sets it as text, never as
// HTML.
type State struct {
	Store      string `json:"store"`
	SampledAt  string `json:"sampled_at"` // RFC 3339 with ms; "" before the first sample
	IntervalMS int64  `json:"interval_ms"`
	// Error is the last sample's error ("" when it succeeded); Locks are
	// then those of the last good sample.
	Error string `json:"error"`
	// Release reports that the page may offer a force-release button
	// (dlock dash --allow-release); requests still need the token.
	Release bool `json:"release"`
	// Notifications reports that the sampler listens to the store's
	// release notifications (Config.Notifier).
	Notifications bool   `json:"notifications"`
	Locks         []Lock `json:"locks"`
	Totals        Totals `json:"totals"`
	Counts        Counts `json:"counts"`
}

// Totals are store-level figures of one sample.
type Totals struct {
	Locks          int `json:"locks"`     // locks with an exclusive holder or shared holds
	Exclusive      int `json:"exclusive"` // exclusive holds
	Shared         int `json:"shared"`    // shared holds (readers and permits)
	Queued         int `json:"queued"`    // waiters in queues
	WritersWaiting int `json:"writers_waiting"`
	Delayed        int `json:"delayed"` // locks kept in their lock-delay
}

// Lock is one held lock.
type Lock struct {
	Name string `json:"name"` // escaped, for display
	// KeyHex is the lock's name as stored, in hexadecimal, for the
	// force-release request only (and only with Config.Release): hex keeps
	// control and bidi characters out of the JSON.
	KeyHex string `json:"key_hex,omitempty"`
	// Kind is "exclusive", "readers" or "permits".
	Kind  string `json:"kind"`
	Owner string `json:"owner"` // the exclusive holder, "" for shared holds
	Fence uint64 `json:"fence"`
	// FenceDec is Fence in decimal, "" when the lock has no exclusive
	// holder: the page sends it back with a force release (JavaScript
	// numbers are exact only up to 2^53).
	FenceDec      string   `json:"fence_dec,omitempty"`
	Holds         int      `json:"holds"`
	HeldForMS     *int64   `json:"held_for_ms"` // null when unknown
	ExpiresInMS   int64    `json:"expires_in_ms"`
	Delayed       bool     `json:"delayed"`
	Shared        []Shared `json:"shared"`
	Limit         int      `json:"limit"` // a semaphore's permits, 0 otherwise
	Queued        int      `json:"queued"`
	WriterWaiting bool     `json:"writer_waiting"`
}

// Shared is one reader or permit holder of a Lock.
type Shared struct {
	Owner       string `json:"owner"`
	Fence       uint64 `json:"fence"`
	HeldForMS   *int64 `json:"held_for_ms"`
	ExpiresInMS int64  `json:"expires_in_ms"`
}

// New returns a Dash; Run samples.
func New(cfg Config) *Dash {
	if cfg.Interval <= 0 {
		cfg.Interval = 250 * time.Millisecond
	}
	if cfg.Window <= 0 {
		cfg.Window = 5 * time.Minute
	}
	d := &Dash{cfg: cfg, holds: map[holdID]holdSeen{}}
	d.state = State{Store: safetext.Escape(cfg.Where), IntervalMS: cfg.Interval.Milliseconds(), Locks: []Lock{}}
	if cfg.Release == nil || cfg.ReleaseToken == "" {
		d.cfg.Release, d.cfg.ReleaseToken = nil, ""
	}
	d.state.Release = d.cfg.Release != nil
	return d
}

// Run samples the store every interval until ctx is done; with
// Config.Notifier, also at once when the store announces the release of a
// lock the last sample saw held.
func (d *Dash) Run(ctx context.Context) {
	t := time.NewTicker(d.cfg.Interval)
	defer t.Stop()
	w := newWatcher(d.cfg.Notifier, &d.notifying)
	w.start(ctx)
	defer w.stop()
	for {
		d.sample(ctx, w.take())
		d.lastSample = time.Now()
		w.want(d.heldKeys())
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-w.wake:
			d.mu.Lock()
			d.counts.Wakeups++
			d.mu.Unlock()
			// A hot lock announces a release every few hundred µs, and each
			// sample lists the whole store: the wake-ups that come within
			// minNotifiedGap of the last sample are merged into one later
			// sample (their keys stay announced until it takes them).
			if wait := time.Until(d.lastSample.Add(min(d.cfg.Interval, minNotifiedGap))); wait > 0 {
				gap := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					gap.Stop()
					return
				case <-gap.C:
				}
			}
		}
	}
}

// minNotifiedGap is the least time between the end of one sample and a
// sample a notification asks for: at most ten Lists a second however hot
// the locks are.
const minNotifiedGap = 100 * time.Millisecond

// heldKeys returns the keys of the locks the last good sample saw held.
func (d *Dash) heldKeys() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	seen := make(map[string]bool, len(d.holds))
	keys := make([]string, 0, len(d.holds))
	for id := range d.holds {
		if !seen[id.key] {
			seen[id.key] = true
			keys = append(keys, id.key)
		}
	}
	return keys
}

// Sample takes one sample of the store now.
func (d *Dash) Sample(ctx context.Context) { d.sample(ctx, nil) }

// sample is Sample, told which keys' releases the store announced since the
// last sample.
func (d *Dash) sample(ctx context.Context, announced map[string]bool) {
	sctx, cancel := context.WithTimeout(ctx, max(2*d.cfg.Interval, 2*time.Second))
	infos, err := d.cfg.List(sctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	now := time.Now()
	d.mu.Lock()
	defer d.mu.Unlock()
	d.counts.Samples++
	d.state.SampledAt = now.UTC().Format("2006-01-02T15:04:05.000Z07:00")
	if err != nil {
		d.counts.SampleErrors++
		d.state.Error = safetext.Escape(err.Error())
		d.state.Counts = d.counts
		return
	}
	d.state.Error = ""
	b := d.bucket(now)
	holds := make(map[holdID]holdSeen, len(d.holds))
	locks := make([]Lock, 0, len(infos))
	var tot Totals
	for _, info := range infos {
		l := d.lock(info, now)
		locks = append(locks, l)
		tot.Locks++
		tot.Queued += info.Queued
		if info.WriterWaiting {
			tot.WritersWaiting++
		}
		if info.Delayed {
			tot.Delayed++
		}
		if l.Kind == "exclusive" {
			tot.Exclusive++
			holds[holdID{info.Key, info.Fence}] = holdSeen{ttl: info.TTL, delayed: info.Delayed}
		}
		for _, h := range info.Shared {
			tot.Shared++
			holds[holdID{info.Key, h.Fence}] = holdSeen{ttl: h.TTL}
		}
	}
	if d.sampled {
		d.diff(holds, announced, b)
	}
	d.holds, d.sampled = holds, true
	b.Held, b.Queued = max(b.Held, tot.Locks), max(b.Queued, tot.Queued)
	d.state.Locks, d.state.Totals, d.state.Counts = locks, tot, d.counts
}

// diff counts the grants, releases and losses between the last sample's
// holds and these. A hold that is gone is a loss when its lease could have
// run out since it was last seen (its TTL then was at most two intervals: a
// holder renews at a third of its TTL, so a live one is never seen that
// low), or when it entered its lock-delay (its lease expired unreleased);
// otherwise a release (dlock release --force included). A hold of a key
// whose release the store announced (announced) is a release.
func (d *Dash) diff(holds map[holdID]holdSeen, announced map[string]bool, b *Bucket) {
	for id, h := range holds {
		old, ok := d.holds[id]
		switch {
		case !ok && !h.delayed:
			b.Grants++
			d.counts.Grants++
		case h.delayed && (!ok || !old.delayed):
			b.Losses++
			d.counts.Losses++
		}
	}
	for id, old := range d.holds {
		if _, ok := holds[id]; ok || old.delayed {
			continue
		}
		if old.ttl <= 2*d.cfg.Interval && !announced[id.key] {
			b.Losses++
			d.counts.Losses++
		} else {
			b.Releases++
			d.counts.Releases++
		}
	}
}

// bucket returns the timeline's bucket for now's second, dropping those
// older than the window.
func (d *Dash) bucket(now time.Time) *Bucket {
	sec := now.Unix()
	if n := len(d.timeline); n == 0 || d.timeline[n-1].Unix != sec {
		d.timeline = append(d.timeline, Bucket{Unix: sec})
	}
	oldest := sec - int64(d.cfg.Window/time.Second)
	i := 0
	for i < len(d.timeline) && d.timeline[i].Unix <= oldest {
		i++
	}
	d.timeline = append(d.timeline[:0], d.timeline[i:]...)
	return &d.timeline[len(d.timeline)-1]
}

func (d *Dash) lock(info driver.LockInfo, now time.Time) Lock {
	l := Lock{
		Name:          safetext.Escape(info.Key),
		Queued:        info.Queued,
		WriterWaiting: info.WriterWaiting,
		Limit:         info.Limit,
		Shared:        []Shared{},
		Delayed:       info.Delayed,
	}
	if d.cfg.Release != nil {
		l.KeyHex = hex.EncodeToString([]byte(info.Key))
	}
	if info.Owner != "" || len(info.Shared) == 0 {
		l.Kind, l.Owner, l.Fence, l.Holds = "exclusive", safetext.Escape(info.Owner), info.Fence, info.Holds
		if info.Fence != 0 {
			l.FenceDec = strconv.FormatUint(info.Fence, 10)
		}
		l.ExpiresInMS = info.TTL.Milliseconds()
		l.HeldForMS = d.heldFor(info, now)
		return l
	}
	l.Kind, l.Holds = "readers", len(info.Shared)
	if info.Limit > 0 {
		l.Kind = "permits"
	}
	for _, h := range info.Shared {
		l.Shared = append(l.Shared, Shared{
			Owner:       safetext.Escape(h.Owner),
			Fence:       h.Fence,
			HeldForMS:   d.heldFor(driver.LockInfo{Owner: h.Owner}, now),
			ExpiresInMS: h.TTL.Milliseconds(),
		})
		l.ExpiresInMS = max(l.ExpiresInMS, h.TTL.Milliseconds())
	}
	l.HeldForMS = l.Shared[0].HeldForMS
	return l
}

func (d *Dash) heldFor(info driver.LockInfo, now time.Time) *int64 {
	if d.cfg.HeldFor == nil {
		return nil
	}
	if h, ok := d.cfg.HeldFor(info, now); ok {
		ms := h.Milliseconds()
		return &ms
	}
	return nil
}

// Snapshot returns the last sample and the timeline.
func (d *Dash) Snapshot() (State, []Bucket) {
	d.mu.Lock()
	defer d.mu.Unlock()
	st := d.state
	st.Notifications = d.notifying.Load()
	return st, append([]Bucket(nil), d.timeline...)
}
