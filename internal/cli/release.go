package cli

import (
	"context"
	"flag"
	"fmt"
	"strings"
	"time"
)

// releaseFlags returns release's flag set, with --force.
func releaseFlags(a *app) (*flag.FlagSet, *bool) {
	fs := a.newFlagSet("release")
	return fs, fs.Bool("force", false, "")
}

func cmdRelease(ctx context.Context, a *app, args []string) error {
	fs, force := releaseFlags(a)
	pos, err := a.parseCommand(fs, "release", args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageErr("release", "want one lock NAME, not %d", len(pos))
	}
	name := pos[0]
	if !*force {
		return usageErr("release", "refusing to break %q without --force: its holder would go on working, "+
			"unaware, until its next renewal fails; a lock you hold is released when your 'dlock run' ends", name)
	}
	st, in, err := a.openInspector(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	info, ok, err := in.ForceRelease(ctx, name)
	if err != nil {
		return st.storeErr(fmt.Sprintf("release %q", name), err)
	}
	if !ok {
		fmt.Fprintf(a.stdout, "lock %q was not held; nothing to release\n", name)
		return nil
	}
	details := []string{fmt.Sprintf("fence %d", info.Fence)}
	if d, ok := heldFor(info, time.Now()); ok {
		details = append(details, "held for "+fmtDuration(d))
	}
	if info.Holds > 1 {
		details = append(details, fmt.Sprintf("%d holds", info.Holds))
	}
	fmt.Fprintf(a.stdout, "released %q, held by %s (%s)\n", name, holderText(info.Owner), strings.Join(details, ", "))
	return nil
}
