// The ls and inspect commands, with their table and JSON output.

package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode/utf8"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/safetext"
	"github.com/spf13/pflag"
)

// lockJSON is one lock in the output of ls --json, inspect --json and
// release --json. The field names are stable; durations are whole
// milliseconds; a value that is absent or unknown is null.
type lockJSON struct {
	Name string `json:"name"`
	Held bool   `json:"held"`
	// The exclusive holder: every field null when the lock has only shared
	// holds.
	Owner       *string    `json:"owner"`
	OwnerInfo   *ownerJSON `json:"owner_info"` // null too for an owner string dlock did not write
	Fence       *uint64    `json:"fence"`
	Holds       *int       `json:"holds"`
	HeldForMS   *int64     `json:"held_for_ms"` // null when unknown
	ExpiresInMS *int64     `json:"expires_in_ms"`
	// InLockDelay: the lease expired without a release and the lock is kept
	// from others for its lock-delay; ExpiresInMS is then the time left
	// until it is free.
	InLockDelay bool `json:"in_lock_delay"`

	// Shared lists the shared holds (readers, semaphore permits), oldest
	// first; [] when none.
	Shared []sharedJSON `json:"shared"`
	// Limit is the semaphore's permit count (of its newest grant), null
	// for readers and plain locks.
	Limit *int `json:"limit"`
	// Queued is the number of waiters in the name's queue.
	Queued int `json:"queued"`
	// WriterWaiting: a writer waits for the shared holds to end, and new
	// readers wait behind it.
	WriterWaiting bool `json:"writer_waiting"`
}

// sharedJSON is one shared hold in lockJSON.
type sharedJSON struct {
	Owner       string     `json:"owner"`
	OwnerInfo   *ownerJSON `json:"owner_info"`
	Fence       uint64     `json:"fence"`
	HeldForMS   *int64     `json:"held_for_ms"` // null when unknown
	ExpiresInMS int64      `json:"expires_in_ms"`
}

// ownerJSON is an owner string that dlock wrote, in its parts: the
// metadata may hold '|', which the owner string cannot tell apart from its
// separators when read from the left, but it is always the last part.
type ownerJSON struct {
	Host       string  `json:"host"`
	PID        int     `json:"pid"`
	Client     int     `json:"client"` // the process's dlock Client, from 1
	AcquiredAt string  `json:"acquired_at"`
	Metadata   *string `json:"metadata"` // null when none was given
}

// parseOwner splits an owner string that dlock wrote (see splitOwner); nil
// for others.
func parseOwner(owner string) *ownerJSON {
	p, ok := splitOwner(owner)
	if !ok {
		return nil
	}
	if _, _, ok := safetext.Check(p.host); !ok || p.host == "" {
		return nil // not a host name dlock wrote
	}
	o := &ownerJSON{Host: p.host, Client: 1, AcquiredAt: p.at, Metadata: p.metadata}
	pid, client, hasClient := strings.Cut(p.pid, " client ")
	var err error
	if o.PID, err = strconv.Atoi(pid); err != nil {
		return nil
	}
	if hasClient {
		if o.Client, err = strconv.Atoi(client); err != nil {
			return nil
		}
	}
	return o
}

// notHeldJSON is inspect --json's answer for a lock nobody holds.
type notHeldJSON struct {
	Name string `json:"name"`
	Held bool   `json:"held"`
}

func toJSON(info driver.LockInfo, now time.Time) lockJSON {
	j := lockJSON{Name: info.Key, Held: true, InLockDelay: info.Delayed}
	if info.Owner != "" || len(info.Shared) == 0 {
		owner, fence, holds, expires := info.Owner, info.Fence, info.Holds, info.TTL.Milliseconds()
		j.Owner, j.OwnerInfo, j.Fence, j.Holds, j.ExpiresInMS = &owner, parseOwner(owner), &fence, &holds, &expires
		if d, ok := heldFor(info, now); ok {
			ms := d.Milliseconds()
			j.HeldForMS = &ms
		}
	}
	j.Shared = make([]sharedJSON, 0, len(info.Shared))
	for _, h := range info.Shared {
		sj := sharedJSON{Owner: h.Owner, OwnerInfo: parseOwner(h.Owner), Fence: h.Fence, ExpiresInMS: h.TTL.Milliseconds()}
		if d, ok := heldFor(driver.LockInfo{Owner: h.Owner}, now); ok {
			ms := d.Milliseconds()
			sj.HeldForMS = &ms
		}
		j.Shared = append(j.Shared, sj)
	}
	if info.Limit > 0 {
		limit := info.Limit
		j.Limit = &limit
	}
	j.Queued, j.WriterWaiting = info.Queued, info.WriterWaiting
	return j
}

// noStoreError is openInspector's answer for a SQLite file that does not
// exist: no lock is held there, and a command that only looks must not
// create it.
type noStoreError struct {
	path     string
	explicit bool // named by the user, not the default file: a typo, maybe
}

func (e *noStoreError) Error() string { return "no SQLite file at " + e.path }

// note is what the commands add to their "not held" answers: nothing for
// the default file, which a first run creates; the path for a named one.
func (e *noStoreError) note() string {
	if e == nil || !e.explicit {
		return ""
	}
	return " (no SQLite file at " + safetext.Escape(e.path) + ")"
}

// openInspector opens the store for ls, inspect and release, and returns its
// Inspector, or why there is none: a *noStoreError for a SQLite file (the
// default one included) that does not exist yet, which it leaves uncreated.
// The caller closes the store.
func (a *app) openInspector(ctx context.Context) (*store, driver.Inspector, error) {
	a.readOnly = true
	b, err := a.backendURL()
	if err != nil {
		return nil, nil, err
	}
	if b.kind == kindSQLite {
		if _, err := os.Stat(b.path); errors.Is(err, os.ErrNotExist) {
			if _, derr := os.Stat(filepath.Dir(b.path)); derr == nil || b.isDefault {
				return nil, nil, &noStoreError{path: b.path, explicit: !b.isDefault}
			}
		}
	}
	st, err := a.open(ctx)
	if err != nil {
		return nil, nil, err
	}
	if st.inspector == nil {
		st.Close()
		return nil, nil, fail(exitUnavailable, "%s cannot list or inspect its locks", st.where)
	}
	return st, st.inspector, nil
}

// lsCommand defines ls's flag on fs and returns what runs it.
func lsCommand(a *app, fs *pflag.FlagSet) runner {
	asJSON := fs.Bool("json", false, "one JSON array of objects, for scripts")
	return func(ctx context.Context, args []string, _ int) error { return cmdLs(ctx, a, *asJSON, args) }
}

// inspectCommand defines inspect's flag on fs and returns what runs it.
func inspectCommand(a *app, fs *pflag.FlagSet) runner {
	asJSON := fs.Bool("json", false, "one JSON object, for scripts")
	return func(ctx context.Context, args []string, _ int) error { return cmdInspect(ctx, a, *asJSON, args) }
}

func cmdLs(ctx context.Context, a *app, asJSON bool, pos []string) error {
	if len(pos) > 1 {
		return usageErr("ls", "at most one PREFIX, not %d", len(pos))
	}
	var prefix string
	if len(pos) == 1 {
		prefix = pos[0]
	}
	var (
		infos   []driver.LockInfo
		noStore *noStoreError
	)
	st, in, err := a.openInspector(ctx)
	switch {
	case errors.As(err, &noStore):
	case err != nil:
		return err
	default:
		defer st.Close()
		if infos, err = in.List(ctx, prefix); err != nil {
			return st.storeErr("list locks", err)
		}
	}
	now := time.Now()
	if asJSON {
		out := make([]lockJSON, 0, len(infos))
		for _, info := range infos {
			out = append(out, toJSON(info, now))
		}
		return writeJSON(a.stdout, out)
	}
	if len(infos) == 0 {
		if prefix != "" {
			fmt.Fprintf(a.stdout, "no locks held under %q%s\n", shorten(prefix, 80), noStore.note())
		} else {
			fmt.Fprintf(a.stdout, "no locks held%s\n", noStore.note())
		}
		return nil
	}
	writeTable(a.stdout, infos, now)
	return nil
}

func cmdInspect(ctx context.Context, a *app, asJSON bool, pos []string) error {
	if len(pos) != 1 {
		return usageErr("inspect", "want one lock NAME, not %d", len(pos))
	}
	name := pos[0]
	if err := checkNameArg("inspect", name); err != nil {
		return err
	}
	var (
		info    driver.LockInfo
		ok      bool
		noStore *noStoreError
	)
	st, in, err := a.openInspector(ctx)
	switch {
	case errors.As(err, &noStore):
	case err != nil:
		return err
	default:
		defer st.Close()
		if info, ok, err = in.Inspect(ctx, name); err != nil {
			return st.storeErr(fmt.Sprintf("inspect %q", name), err)
		}
	}
	switch {
	case asJSON && !ok:
		if err := writeJSON(a.stdout, notHeldJSON{Name: name}); err != nil {
			return err
		}
	case asJSON:
		return writeJSON(a.stdout, toJSON(info, time.Now()))
	case !ok:
		fmt.Fprintf(a.stdout, "lock %q is not held%s\n", name, noStore.note())
	default:
		now := time.Now()
		writeTable(a.stdout, []driver.LockInfo{info}, now)
		if len(info.Shared) > 0 {
			fmt.Fprintln(a.stdout)
			writeSharedTable(a.stdout, info, now)
		}
		return nil
	}
	return &exitError{code: exitNotHeld}
}

// writeTable prints locks as an aligned table. The SHARED and WAITING
// columns are added when a lock has shared holds or waiters.
func writeTable(w io.Writer, infos []driver.LockInfo, now time.Time) {
	extra := false
	for _, info := range infos {
		extra = extra || len(info.Shared) > 0 || info.Queued > 0 || info.WriterWaiting
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	header := "NAME\tOWNER\tFENCE\tHELD FOR\tEXPIRES IN\tHOLDS"
	if extra {
		header += "\tSHARED\tWAITING"
	}
	fmt.Fprintln(tw, header)
	for _, info := range infos {
		owner, fence, held, expires, holds := "-", "-", "-", "-", "-"
		if info.Owner != "" || len(info.Shared) == 0 {
			owner, fence, holds = tableCell(info.Owner), strconv.FormatUint(info.Fence, 10), strconv.Itoa(info.Holds)
			if d, ok := heldFor(info, now); ok {
				held = fmtDuration(d)
			}
			expires = fmtDuration(info.TTL)
			if info.Delayed {
				expires = "expired, free in " + expires
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s", tableCell(info.Key), owner, fence, held, expires, holds)
		if extra {
			fmt.Fprintf(tw, "\t%s\t%s", sharedText(info), waitingText(info))
		}
		fmt.Fprintln(tw)
	}
	_ = tw.Flush()
}

// sharedText is the SHARED cell: "3 readers", "3/5 permits" or "-".
func sharedText(info driver.LockInfo) string {
	switch n := len(info.Shared); {
	case n == 0:
		return "-"
	case info.Limit > 0:
		return fmt.Sprintf("%d/%d permits", n, info.Limit)
	case n == 1:
		return "1 reader"
	default:
		return fmt.Sprintf("%d readers", n)
	}
}

// waitingText is the WAITING cell: "writer", "2 queued", "writer, 2
// queued" or "-".
func waitingText(info driver.LockInfo) string {
	var parts []string
	if info.WriterWaiting {
		parts = append(parts, "writer")
	}
	if info.Queued > 0 {
		parts = append(parts, fmt.Sprintf("%d queued", info.Queued))
	}
	if len(parts) == 0 {
		return "-"
	}
	return strings.Join(parts, ", ")
}

// writeSharedTable lists the shared holds of info, one line each.
func writeSharedTable(w io.Writer, info driver.LockInfo, now time.Time) {
	who := "READER"
	if info.Limit > 0 {
		who = "PERMIT HOLDER"
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\tFENCE\tHELD FOR\tEXPIRES IN\n", who)
	for _, h := range info.Shared {
		held := "-"
		if d, ok := heldFor(driver.LockInfo{Owner: h.Owner}, now); ok {
			held = fmtDuration(d)
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", tableCell(h.Owner), h.Fence, held, fmtDuration(h.TTL))
	}
	_ = tw.Flush()
}

// tableCell keeps a value on its line and in its column, and the reader's
// terminal as it was: names and owners written by other programs may hold
// tabs, escape sequences, C1 or bidi characters, which are shown quoted.
func tableCell(s string) string {
	if s == "" {
		return "-"
	}
	return safetext.Escape(s)
}

func writeJSON(w io.Writer, v any) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fail(exitUnavailable, "write JSON: %v", err)
	}
	// encoding/json writes C1 controls and bidi formatting characters as
	// they are: escape them too, so that a hostile owner string shown with
	// cat reaches no terminal raw. JSON's own syntax is ASCII: every such
	// rune is inside a string, where \u escapes mean the same.
	out := make([]byte, 0, buf.Len())
	for _, r := range buf.String() {
		if r != '\n' && safetext.Unsafe(r) {
			out = fmt.Appendf(out, "\\u%04x", r)
			continue
		}
		out = utf8.AppendRune(out, r)
	}
	if _, err := w.Write(out); err != nil {
		return fail(exitUnavailable, "write JSON: %v", err)
	}
	return nil
}
