package cli

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/dlock-go/dlock/driver"
)

// lockJSON is one lock in the output of ls --json and inspect --json. The
// field names are stable; durations are whole milliseconds.
type lockJSON struct {
	Name        string `json:"name"`
	Held        bool   `json:"held"`
	Owner       string `json:"owner"`
	Fence       uint64 `json:"fence"`
	Holds       int    `json:"holds"`
	HeldForMS   *int64 `json:"held_for_ms"` // null when unknown
	ExpiresInMS int64  `json:"expires_in_ms"`
	// InLockDelay: the lease expired without a release and the lock is kept
	// from others for its lock-delay; ExpiresInMS is then the time left
	// until it is free.
	InLockDelay bool `json:"in_lock_delay,omitempty"`
}

// notHeldJSON is inspect --json's answer for a lock nobody holds.
type notHeldJSON struct {
	Name string `json:"name"`
	Held bool   `json:"held"`
}

func toJSON(info driver.LockInfo, now time.Time) lockJSON {
	j := lockJSON{Name: info.Key, Held: true, Owner: info.Owner, Fence: info.Fence, Holds: info.Holds}
	if d, ok := heldFor(info, now); ok {
		ms := d.Milliseconds()
		j.HeldForMS = &ms
	}
	j.ExpiresInMS = info.TTL.Milliseconds()
	j.InLockDelay = info.Delayed
	return j
}

// openInspector opens the store for ls, inspect and release, and returns its
// Inspector, or why there is none. The caller closes the store.
func (a *app) openInspector(ctx context.Context) (*store, driver.Inspector, error) {
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

// jsonFlags returns the flag set of ls or inspect, with --json.
func jsonFlags(a *app, cmd string) (*flag.FlagSet, *bool) {
	fs := a.newFlagSet(cmd)
	return fs, fs.Bool("json", false, "")
}

func cmdLs(ctx context.Context, a *app, args []string) error {
	fs, asJSON := jsonFlags(a, "ls")
	pos, err := a.parseCommand(fs, "ls", args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usageErr("ls", "at most one PREFIX, not %d", len(pos))
	}
	var prefix string
	if len(pos) == 1 {
		prefix = pos[0]
	}
	st, in, err := a.openInspector(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	infos, err := in.List(ctx, prefix)
	if err != nil {
		return st.storeErr("list locks", err)
	}
	now := time.Now()
	if *asJSON {
		out := make([]lockJSON, 0, len(infos))
		for _, info := range infos {
			out = append(out, toJSON(info, now))
		}
		return writeJSON(a.stdout, out)
	}
	if len(infos) == 0 {
		if prefix != "" {
			fmt.Fprintf(a.stdout, "no locks held under %q\n", prefix)
		} else {
			fmt.Fprintln(a.stdout, "no locks held")
		}
		return nil
	}
	writeTable(a.stdout, infos, now)
	return nil
}

func cmdInspect(ctx context.Context, a *app, args []string) error {
	fs, asJSON := jsonFlags(a, "inspect")
	pos, err := a.parseCommand(fs, "inspect", args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr("inspect", "want one lock NAME, not %d", len(pos))
	}
	name := pos[0]
	st, in, err := a.openInspector(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	info, ok, err := in.Inspect(ctx, name)
	if err != nil {
		return st.storeErr(fmt.Sprintf("inspect %q", name), err)
	}
	switch {
	case *asJSON && !ok:
		if err := writeJSON(a.stdout, notHeldJSON{Name: name}); err != nil {
			return err
		}
	case *asJSON:
		return writeJSON(a.stdout, toJSON(info, time.Now()))
	case !ok:
		fmt.Fprintf(a.stdout, "lock %q is not held\n", name)
	default:
		writeTable(a.stdout, []driver.LockInfo{info}, time.Now())
		return nil
	}
	return &exitError{code: exitNotHeld}
}

// writeTable prints locks as an aligned table.
func writeTable(w io.Writer, infos []driver.LockInfo, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tOWNER\tFENCE\tHELD FOR\tEXPIRES IN\tHOLDS")
	for _, info := range infos {
		held := "-"
		if d, ok := heldFor(info, now); ok {
			held = fmtDuration(d)
		}
		expires := fmtDuration(info.TTL)
		if info.Delayed {
			expires = "expired, free in " + expires
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\n",
			tableCell(info.Key), tableCell(info.Owner), info.Fence, held, expires, info.Holds)
	}
	_ = tw.Flush()
}

// tableCell keeps a value on its line and in its column: names and owners
// may hold tabs or other odd characters, which are shown quoted.
func tableCell(s string) string {
	if s == "" {
		return "-"
	}
	for _, r := range s {
		if r < ' ' || r == 0x7f {
			return strconv.Quote(s)
		}
	}
	return s
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(v); err != nil {
		return fail(exitUnavailable, "write JSON: %v", err)
	}
	return nil
}
