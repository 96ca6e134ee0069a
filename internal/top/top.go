// Package top is the view of dlock top: it samples one store's held locks
// through a driver.Inspector and renders them as a table, once or again and
// again in place on a terminal. It knows nothing of flags or URLs; the
// dlock command wires it (internal/cli/top.go).
package top

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/safetext"
)

// Order is the order of the rows.
type Order int

const (
	// ByHold puts the lock held longest first.
	ByHold Order = iota
	// ByWait puts first the lock whose waiters have waited longest, as far
	// as top has seen them, then the longest queue.
	ByWait
)

// ParseOrder reads an Order from its flag value, "hold" or "wait".
func ParseOrder(s string) (Order, error) {
	switch s {
	case "hold":
		return ByHold, nil
	case "wait":
		return ByWait, nil
	}
	return 0, fmt.Errorf("unknown order %q (want hold or wait)", s)
}

// Config is what a View needs besides the store.
type Config struct {
	// List returns the store's held locks (driver.Inspector.List with the
	// prefix applied).
	List func(ctx context.Context) ([]driver.LockInfo, error)
	// HeldFor tells how long a hold has been held (the store's measure or
	// the owner string's time), ok false when unknown.
	HeldFor func(info driver.LockInfo, now time.Time) (d time.Duration, ok bool)
	// Duration formats a duration for people.
	Duration func(time.Duration) string
	// Where names the store in the title line (already redacted).
	Where string
	// Order of the rows.
	Order Order
	// MaxCell is the longest holder or name cell, in runes, before it is
	// cut with "..."; 0 means 90.
	MaxCell int
}

// Row is one held lock, ready to print.
type Row struct {
	Name string // escaped
	// Kind is "exclusive", "readers" or "permits".
	Kind string
	// Holder is the exclusive holder's owner string, or the oldest shared
	// hold's with "(+N more)", escaped.
	Holder    string
	HeldFor   time.Duration
	HeldKnown bool
	ExpiresIn time.Duration
	Delayed   bool
	// Holds is the shared holds' count ("3" readers, "3/5" permits), or the
	// exclusive holder's hold count.
	Holds string
	// Queued waiters and whether a writer waits.
	Queued        int
	WriterWaiting bool
	// WaitingFor is how long top has seen this lock with waiters, 0 when it
	// has none.
	WaitingFor time.Duration
}

// View samples a store and remembers, between samples, since when each lock
// has had waiters. It is not safe for concurrent use.
type View struct {
	cfg          Config
	waitingSince map[string]time.Time
}

// New returns a View.
func New(cfg Config) *View {
	if cfg.MaxCell <= 0 {
		cfg.MaxCell = 90
	}
	cfg.Where = safetext.Escape(cfg.Where) // a URL or path may hold anything
	return &View{cfg: cfg, waitingSince: map[string]time.Time{}}
}

// Sample lists the store's locks and returns them as rows in the view's
// order.
func (v *View) Sample(ctx context.Context) ([]Row, time.Time, error) {
	infos, err := v.cfg.List(ctx)
	now := time.Now()
	if err != nil {
		return nil, now, err
	}
	return v.rows(infos, now), now, nil
}

func (v *View) rows(infos []driver.LockInfo, now time.Time) []Row {
	rows := make([]Row, 0, len(infos))
	seen := make(map[string]bool, len(infos))
	for _, info := range infos {
		r := v.row(info, now)
		if r.Queued > 0 || r.WriterWaiting {
			since, ok := v.waitingSince[info.Key]
			if !ok {
				since = now
				v.waitingSince[info.Key] = now
			}
			r.WaitingFor = now.Sub(since)
			seen[info.Key] = true
		}
		rows = append(rows, r)
	}
	for k := range v.waitingSince {
		if !seen[k] {
			delete(v.waitingSince, k)
		}
	}
	switch v.cfg.Order {
	case ByWait:
		slices.SortStableFunc(rows, func(a, b Row) int {
			return cmp.Or(cmp.Compare(b.WaitingFor, a.WaitingFor), cmp.Compare(b.Queued, a.Queued),
				cmp.Compare(b.HeldFor, a.HeldFor), strings.Compare(a.Name, b.Name))
		})
	default:
		slices.SortStableFunc(rows, func(a, b Row) int {
			return cmp.Or(cmp.Compare(b.HeldFor, a.HeldFor), strings.Compare(a.Name, b.Name))
		})
	}
	return rows
}

func (v *View) row(info driver.LockInfo, now time.Time) Row {
	r := Row{
		Name:          cut(safetext.Escape(info.Key), v.cfg.MaxCell),
		Queued:        info.Queued,
		WriterWaiting: info.WriterWaiting,
		Delayed:       info.Delayed,
	}
	if info.Owner != "" || len(info.Shared) == 0 {
		r.Kind = "exclusive"
		r.Holder = cut(holder(info.Owner), v.cfg.MaxCell)
		r.HeldFor, r.HeldKnown = v.cfg.HeldFor(info, now)
		r.ExpiresIn = info.TTL
		r.Holds = strconv.Itoa(info.Holds)
		return r
	}
	oldest := info.Shared[0]
	r.Kind, r.Holds = "readers", strconv.Itoa(len(info.Shared))
	if info.Limit > 0 {
		r.Kind, r.Holds = "permits", fmt.Sprintf("%d/%d", len(info.Shared), info.Limit)
	}
	r.Holder = cut(holder(oldest.Owner), v.cfg.MaxCell)
	if n := len(info.Shared) - 1; n > 0 {
		r.Holder += fmt.Sprintf(" (+%d more)", n)
	}
	r.HeldFor, r.HeldKnown = v.cfg.HeldFor(driver.LockInfo{Owner: oldest.Owner}, now)
	r.ExpiresIn = oldest.TTL
	for _, h := range info.Shared[1:] {
		r.ExpiresIn = max(r.ExpiresIn, h.TTL) // the lock is held until the last one ends
	}
	return r
}

func holder(owner string) string {
	if owner == "" {
		return "-"
	}
	return safetext.Escape(owner)
}

// cut shortens s to n runes with "..." (s is escaped already: cutting it
// cannot make an unsafe rune).
func cut(s string, n int) string {
	if utf8.RuneCountInString(s) <= n {
		return s
	}
	return string([]rune(s)[:n-3]) + "..."
}

// WriteTable writes rows as an aligned table with a header line.
func (v *View) WriteTable(w io.Writer, rows []Row) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tHOLDS\tHOLDER\tHELD FOR\tEXPIRES IN\tWAITERS")
	for _, r := range rows {
		held := "-"
		if r.HeldKnown {
			held = v.cfg.Duration(r.HeldFor)
		}
		expires := v.cfg.Duration(r.ExpiresIn)
		if r.Delayed {
			expires = "expired, free in " + expires
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Name, r.Kind, r.Holds, r.Holder, held, expires, v.waiters(r))
	}
	return tw.Flush()
}

// waiters is the WAITERS cell: "-", "2 queued", "writer", "2 queued,
// writer", with "seen 12s" once top has seen them that long: the store
// does not say when a wait began, so the time counts from top's first
// sample with waiters.
func (v *View) waiters(r Row) string {
	var parts []string
	if r.Queued > 0 {
		parts = append(parts, fmt.Sprintf("%d queued", r.Queued))
	}
	if r.WriterWaiting {
		parts = append(parts, "writer")
	}
	if len(parts) == 0 {
		return "-"
	}
	s := strings.Join(parts, ", ")
	if r.WaitingFor >= time.Second {
		s += ", seen " + v.cfg.Duration(r.WaitingFor)
	}
	return s
}

// ANSI sequences of the live view.
const (
	clearScreen = "\x1b[2J"
	home        = "\x1b[H"
	eraseLine   = "\x1b[K"
	eraseBelow  = "\x1b[J"
	hideCursor  = "\x1b[?25l"
	showCursor  = "\x1b[?25h"
)

// Once samples the store and writes the plain table (or "no locks held"),
// for a stdout that is not a terminal.
func (v *View) Once(ctx context.Context, w io.Writer) error {
	rows, _, err := v.Sample(ctx)
	if err != nil {
		return err
	}
	if len(rows) == 0 {
		_, err := fmt.Fprintln(w, "no locks held")
		return err
	}
	return v.WriteTable(w, rows)
}

// Live redraws the view on the terminal w every interval until ctx is done,
// in place: the screen is cleared once, then each frame starts at the home
// position and erases what the previous one left. A failed sample is shown
// on the title line and the view goes on. It returns nil when ctx ends, or
// the error of a failed write (the terminal went away).
func (v *View) Live(ctx context.Context, w io.Writer, interval time.Duration) error {
	if _, err := io.WriteString(w, hideCursor+clearScreen); err != nil {
		return err
	}
	defer io.WriteString(w, showCursor+"\n") //nolint:errcheck // the terminal may be gone
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if err := v.frame(ctx, w, interval); err != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

func (v *View) frame(ctx context.Context, w io.Writer, interval time.Duration) error {
	sctx, cancel := context.WithTimeout(ctx, max(interval, 2*time.Second))
	rows, now, err := v.Sample(sctx)
	cancel()
	if ctx.Err() != nil {
		return nil
	}
	var b strings.Builder
	order := "longest hold first"
	if v.cfg.Order == ByWait {
		order = "longest wait first"
	}
	fmt.Fprintf(&b, "dlock top  %s  %s  every %s, %s; Ctrl-C to quit\n", v.cfg.Where, now.Format("15:04:05"), v.cfg.Duration(interval), order)
	switch {
	case err != nil:
		fmt.Fprintf(&b, "store error: %s\n", safetext.Escape(oneLine(err.Error())))
	case len(rows) == 0:
		b.WriteString("no locks held\n")
	default:
		held, queued := 0, 0
		for _, r := range rows {
			held++
			queued += r.Queued
		}
		fmt.Fprintf(&b, "%s held, %s queued\n\n", plural(held, "lock"), plural(queued, "waiter"))
		_ = v.WriteTable(&b, rows)
	}
	out := home + strings.ReplaceAll(b.String(), "\n", eraseLine+"\n") + eraseBelow
	_, werr := io.WriteString(w, out)
	return werr
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

func plural(n int, what string) string {
	if n == 1 {
		return "1 " + what
	}
	return strconv.Itoa(n) + " " + what + "s"
}
