// The top command: a live view of one store's locks (internal/top).

package cli

import (
	"context"
	"io"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/dlock-go/dlock/internal/top"
	"github.com/spf13/pflag"
)

// topOptions are top's flags.
type topOptions struct {
	interval time.Duration
	order    string
	prefix   string
	once     bool
}

// topCommand defines top's flags on fs and returns what runs it.
func topCommand(a *app, fs *pflag.FlagSet) runner {
	o := &topOptions{}
	durationVar(fs, &o.interval, "interval", time.Second, "time between two samples of the store")
	fs.StringVar(&o.order, "sort", "hold", "hold (the lock held longest first, the default) or wait (the longest-waiting queue first)")
	fs.StringVar(&o.prefix, "prefix", "", "only the locks whose names start with PREFIX")
	fs.BoolVar(&o.once, "once", false, "print the table once, even on a terminal")
	return func(ctx context.Context, args []string, _ int) error { return cmdTop(ctx, a, o, args) }
}

// cmdTop is dlock top [URL]: the store's held locks, redrawn in place every
// --interval while stdout is a terminal, else printed once.
func cmdTop(ctx context.Context, a *app, o *topOptions, pos []string) error {
	if err := a.backendArg("top", pos); err != nil {
		return err
	}
	order, err := top.ParseOrder(o.order)
	if err != nil {
		return usageErr("top", "--sort: %v", err)
	}
	if o.interval < 50*time.Millisecond {
		return usageErr("top", "--interval must be at least 50ms, not %v", o.interval)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	l := &storeLister{a: a, prefix: o.prefix}
	if err := l.open(ctx); err != nil {
		return err
	}
	defer l.Close()
	v := top.New(top.Config{List: l.List, HeldFor: heldForFunc, Duration: fmtDurationFunc, Where: l.where, Order: order})
	if o.once || !isTerminal(a.stdout) {
		out := &writeErrs{w: a.stdout}
		if err := v.Once(ctx, out); err != nil {
			if out.err != nil {
				return fail(exitIOErr, "write the table: %v", out.err)
			}
			return err
		}
		return nil
	}
	if err := v.Live(ctx, a.stdout, o.interval); err != nil {
		return fail(exitIOErr, "write to the terminal: %v", err)
	}
	return nil
}

// backendArg takes the optional URL argument of top and dash: the same as
// --backend, which it may not contradict.
func (a *app) backendArg(cmd string, pos []string) error {
	switch {
	case len(pos) > 1:
		return usageErr(cmd, "at most one URL, not %d", len(pos))
	case len(pos) == 0:
		return nil
	case a.backend != "" && a.backend != pos[0]:
		return usageErr(cmd, "both --backend and a URL given")
	}
	a.backend = pos[0]
	return nil
}

const topSynopsis = "dlock top [URL] [--interval 1s] [--sort hold|wait] [--prefix PREFIX] [--once]"

const topHelp = `usage: ` + topSynopsis + `

Shows the held locks of one store (URL, else --backend, DLOCK_BACKEND or the
default SQLite file), one line each: name; kind (exclusive, readers or
permits); holds (the exclusive holder's hold count, the number of readers,
or permits in use of the semaphore's N); holder (the owner string, or the
oldest reader's or permit holder's with "+N more"); how long it has been
held; when it expires unless renewed; and its waiters ("2 queued" in the
name's queue, "writer" when a writer waits for the readers, with "seen 12s":
how long top has seen them waiting, as the store does not say when a wait
began). Names and owner strings are shown escaped when they
hold control or bidi characters.

When stdout is a terminal, dlock top redraws the view in place every
--interval until Ctrl-C (or SIGTERM, SIGHUP), and shows a store error on its
title line and tries again at the next interval. Otherwise, or with --once,
it prints the table once ("no locks held" when there are none) and exits. It
only reads the store, and creates no SQLite file.

Flags:
  --interval DURATION        time between two samples of the store (default
                             1s, at least 50ms)
  --sort hold|wait           hold: the lock held longest first (the default);
                             wait: the lock whose waiters top has seen waiting
                             longest first, then the longest queue
  --prefix PREFIX            only the locks whose names start with PREFIX
  --once                     print the table once, even on a terminal
` + backendFlagsHelp + `
Exit status: 0; 64 for bad flags or URL; 69 when the store cannot be reached
(at the start; later errors are shown and retried); 74 when the terminal
cannot be written.
`

// writeErrs is a writer that remembers its first write error, to tell a
// failed write from a failed store call.
type writeErrs struct {
	w   io.Writer
	err error
}

func (w *writeErrs) Write(p []byte) (int, error) {
	n, err := w.w.Write(p)
	if err != nil && w.err == nil {
		w.err = err
	}
	return n, err
}
