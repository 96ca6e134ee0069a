// The dlock release --force command.

package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/spf13/pflag"
)

// releaseCommand defines release's flags on fs and returns what runs it.
func releaseCommand(a *app, fs *pflag.FlagSet) runner {
	force := fs.Bool("force", false, "required: really break the lock")
	asJSON := fs.Bool("json", false, "one JSON object, for scripts")
	return func(ctx context.Context, args []string, _ int) error {
		return cmdRelease(ctx, a, *force, *asJSON, args)
	}
}

// releaseJSON is release --json's answer: what was released, if anything.
type releaseJSON struct {
	Name     string    `json:"name"`
	Released bool      `json:"released"`
	Lock     *lockJSON `json:"lock"` // as it was when released; null when it was not held
}

func cmdRelease(ctx context.Context, a *app, force, asJSON bool, pos []string) error {
	if len(pos) != 1 {
		return usageErr("release", "want one lock NAME, not %d", len(pos))
	}
	name := pos[0]
	if err := checkNameArg("release", name); err != nil {
		return err
	}
	if !force {
		return usageErr("release", "refusing to break %q without --force: its holder would go on working, "+
			"unaware, until its next renewal fails; a lock you hold is released when your 'dlock run' ends", name)
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
		if info, ok, err = in.ForceRelease(ctx, name); err != nil {
			return st.storeErr(fmt.Sprintf("release %q", name), err)
		}
	}
	now := time.Now()
	if asJSON {
		out := releaseJSON{Name: name, Released: ok}
		if ok {
			j := toJSON(info, now)
			j.Name = name
			out.Lock = &j
		}
		return writeJSON(a.stdout, out)
	}
	if !ok {
		fmt.Fprintf(a.stdout, "lock %q was not held; nothing to release%s\n", name, noStore.note())
		return nil
	}
	if info.Owner != "" || len(info.Shared) == 0 {
		fmt.Fprintf(a.stdout, "released %q, held by %s (%s)\n", name, holderText(info.Owner), holdDetails(info, now))
	}
	if n := len(info.Shared); n > 0 {
		var who string
		switch {
		case info.Limit > 0:
			who = fmt.Sprintf("%d %s of its %d permits", n, plural(n, "holder", "holders"), info.Limit)
		default:
			who = fmt.Sprintf("%d %s", n, plural(n, "reader", "readers"))
		}
		if info.Owner != "" {
			fmt.Fprintf(a.stdout, "and its %s:\n", who)
		} else {
			fmt.Fprintf(a.stdout, "released %q, held by %s:\n", name, who)
		}
		for _, h := range info.Shared {
			fmt.Fprintf(a.stdout, "  %s (%s)\n", holderText(h.Owner),
				holdDetails(driver.LockInfo{Owner: h.Owner, Fence: h.Fence, Holds: 1}, now))
		}
	}
	if info.Queued > 0 {
		fmt.Fprintf(a.stdout, "%d %s in its queue\n", info.Queued, plural(info.Queued, "waiter stays", "waiters stay"))
	}
	return nil
}

// holdDetails is "fence 3, held for 4.0s, 2 holds" for a hold.
func holdDetails(info driver.LockInfo, now time.Time) string {
	details := []string{fmt.Sprintf("fence %d", info.Fence)}
	if d, ok := heldFor(info, now); ok {
		details = append(details, "held for "+fmtDuration(d))
	}
	if info.Holds > 1 {
		details = append(details, fmt.Sprintf("%d holds", info.Holds))
	}
	return strings.Join(details, ", ")
}

// plural returns one when n is 1, else many.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
