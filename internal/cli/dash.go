// The dash command: a web dashboard of one store (internal/dash).

package cli

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/dlock-go/dlock/internal/dash"
	"github.com/spf13/pflag"
)

// dashOptions are dash's flags.
type dashOptions struct {
	listen    string
	listenAny bool
	interval  time.Duration
	prefix    string
	release   bool
}

// dashCommand defines dash's flags on fs and returns what runs it.
func dashCommand(a *app, fs *pflag.FlagSet) runner {
	o := &dashOptions{}
	fs.StringVar(&o.listen, "listen", "127.0.0.1:8080", "where to serve: HOST:PORT on loopback unless --listen-any")
	fs.BoolVar(&o.listenAny, "listen-any", false, "allow a --listen address that is not loopback, and any Host")
	durationVar(fs, &o.interval, "interval", 250*time.Millisecond, "time between two samples of the store")
	fs.StringVar(&o.prefix, "prefix", "", "only the locks whose names start with PREFIX")
	fs.BoolVar(&o.release, "allow-release", false, "offer a button that force-releases the grant shown, for the holder of the token printed on stderr")
	return func(ctx context.Context, args []string, _ int) error { return cmdDash(ctx, a, o, args) }
}

// cmdDash is dlock dash [URL]: it samples the store every --interval and
// serves the dashboard on --listen until SIGINT, SIGTERM or SIGHUP.
func cmdDash(ctx context.Context, a *app, o *dashOptions, pos []string) error {
	if err := a.backendArg("dash", pos); err != nil {
		return err
	}
	if err := dash.CheckListen(o.listen, o.listenAny); err != nil {
		return usageErr("dash", "%v", err)
	}
	if o.interval < 50*time.Millisecond {
		return usageErr("dash", "--interval must be at least 50ms, not %v", o.interval)
	}
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer stop()
	l := &storeLister{a: a, prefix: o.prefix}
	if err := l.open(ctx); err != nil {
		return err
	}
	defer l.Close()
	ln, err := net.Listen("tcp", o.listen)
	if err != nil {
		return fail(exitUnavailable, "--listen: %v", err)
	}
	cfg := dash.Config{List: l.List, HeldFor: heldForFunc, Where: l.where, Interval: o.interval, Notifier: l.notifier}
	if o.release && !l.canBreak() {
		return usageErr("dash", "--allow-release: %s cannot break a lock only while it is still the grant the page shows (it has no BreakIf), and the button never breaks whoever holds the lock now; use 'dlock release --force NAME'", l.where)
	}
	if o.release {
		var tok [16]byte
		if _, err := rand.Read(tok[:]); err != nil {
			return fail(exitUnavailable, "--allow-release: %v", err)
		}
		cfg.ReleaseToken = hex.EncodeToString(tok[:])
		cfg.Release, cfg.Inspect = l.breakIf, l.inspect
	}
	d := dash.New(cfg)
	srv := &http.Server{Handler: d.Handler(o.listenAny), ReadHeaderTimeout: 10 * time.Second}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		d.Run(ctx)
	}()
	serveErr := make(chan error, 1)
	go func() {
		defer wg.Done()
		serveErr <- srv.Serve(ln)
	}()
	fmt.Fprintf(a.msgs(), "dlock dash: serving %s on http://%s/ (Ctrl-C to stop)\n", l.where, ln.Addr())
	if o.release {
		fmt.Fprintf(a.msgs(), "dlock dash: force release allowed from http://%s/#token=%s only (the token is this run's)\n", ln.Addr(), cfg.ReleaseToken)
	}
	select {
	case <-ctx.Done():
	case err = <-serveErr:
	}
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	_ = srv.Shutdown(sctx)
	cancel()
	stop()
	wg.Wait()
	if err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fail(exitUnavailable, "serve: %v", err)
	}
	return nil
}

const dashSynopsis = "dlock dash [URL] [--listen 127.0.0.1:8080] [--listen-any] [--interval 250ms] [--prefix PREFIX] [--allow-release]"

const dashHelp = `usage: ` + dashSynopsis + `

Serves a web page of one store (URL, else --backend, DLOCK_BACKEND or the
default SQLite file) on --listen: the held locks with their holders and
waiters, refreshed every 500ms; a timeline of the last 5 minutes, per
second, of the grants, releases and losses that dash saw and of the locks
held and waiters queued; and, for the lock clicked, its readers or permit
holders and its queue. Its assets are in the binary: it needs no network.

dash samples the store every --interval and compares two samples: a hold that
appeared is a grant, one that disappeared a release, or a loss when its
lease could have run out since the last sample (or the lock entered its
lock-delay). A grant and release both between two samples go unseen. Where
the store announces releases (Redis, Redlock, PostgreSQL, etcd, SQLite on
this host), dash subscribes to the locks it saw held and samples at once
when one is released.

/metrics serves, in the Prometheus text format, store-level gauges from the
last sample (dlock_locks_held, dlock_exclusive_holds, dlock_shared_holds,
dlock_queued_waiters, dlock_writers_waiting, dlock_locks_in_lock_delay,
dlock_dash_up) and dash's counters (dlock_dash_grants_total, ..._releases_,
..._losses_, ..._samples_, ..._sample_errors_total). /api/state and
/api/timeline serve the same as JSON.

dash only reads the store (it creates no SQLite file) and answers GET and
HEAD only, unless --allow-release: then the detail of a lock with an
exclusive holder has a "force release" button, for a browser that opened
the address with the token dash prints on stderr (http://HOST:PORT/#token=...;
a new token each run). The token travels in a header that another site's
page cannot make a browser send. The button breaks the grant it shows, named
by its fence, and no other: if the lock changed hands since the page's
sample, nothing is broken and the page says so (the new holder keeps its
lock). The broken holder goes on working, unaware, until its next renewal
fails. The button never breaks a grant whose holder asked for a lock-delay
(--lock-delay), nor shared holds (readers, semaphore permits: no button),
which have no single grant; 'dlock release --force NAME' breaks those,
whoever holds them then. --allow-release needs a store that can break a lock
on condition of its grant: Redis, SQLite, PostgreSQL, MySQL, etcd, not
Redlock (exit 64).

dash shows every holder's owner string (host names, process IDs, metadata)
without authentication, so it listens on loopback only, and answers only
requests addressed to localhost or a loopback address, unless --listen-any.
Names and owner strings are shown as text, with control and bidi characters
escaped.

Flags:
  --listen HOST:PORT         where to serve (default 127.0.0.1:8080; port 0
                             picks a free one, printed on stderr)
  --listen-any               allow a --listen address that is not loopback
                             (":8080" is every interface), and requests for any
                             host name
  --interval DURATION        time between two samples of the store (default
                             250ms, at least 50ms)
  --prefix PREFIX            only the locks whose names start with PREFIX
  --allow-release            offer a button that force-releases the grant
                             shown (not a newer one), for the holder of the
                             token printed on stderr
` + backendFlagsHelp + `
Exit status: 0 after SIGINT, SIGTERM or SIGHUP; 64 for bad flags, URL, a
non-loopback --listen without --listen-any, or --allow-release on a store
that cannot break a lock on condition of its grant (Redlock); 69 when the
store cannot be reached at the start or --listen cannot be bound (later
store errors are shown on the page, and dlock_dash_up is 0).
`
