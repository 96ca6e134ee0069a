// Package cli is the dlock command: it maps backend URLs to backends and runs
// the subcommands (run, ls, inspect, release, bench, version, help).
// cmd/dlock only calls Main.
package cli

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
)

// envBackend names the environment variable that gives the backend URL when
// --backend is not set.
const envBackend = "DLOCK_BACKEND"

// app is one invocation of dlock: where it writes and the global flags.
type app struct {
	stdout, stderr io.Writer

	backend        string // --backend; "" means DLOCK_BACKEND, then the default
	passwordFile   string // --password-file; "" means DLOCK_PASSWORD, if set
	connectTimeout time.Duration
	// readOnly: the command only reads the store (ls, inspect) or finds
	// nothing to do on an empty one (release), and must not create a
	// SQLite file or its directory.
	readOnly bool
}

// command is a subcommand.
type command struct {
	name    string
	summary string
	run     func(ctx context.Context, a *app, args []string) error
}

// commandList returns the subcommands in the order help shows them.
func commandList() []command {
	return []command{
		{"run", "run a command while holding a lock", cmdRun},
		{"ls", "list held locks", cmdLs},
		{"inspect", "show one lock", cmdInspect},
		{"release", "break a lock held by someone else (--force)", cmdRelease},
		{"bench", "measure lock latency and throughput on a store", cmdBench},
		{"top", "live view of a store's held locks and waiters", cmdTop},
		{"dash", "web dashboard of a store's locks, with /metrics", cmdDash},
		{"version", "print dlock's version", cmdVersion},
		{"help", "show help for dlock or a command", cmdHelp},
	}
}

func lookupCommand(name string) *command {
	for _, c := range commandList() {
		if c.name == name {
			return &c
		}
	}
	return nil
}

// Main runs dlock with args (without the program name), writing to stdout
// and stderr, and returns the exit code. Errors are printed as one line on
// stderr, never as a stack trace.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr, connectTimeout: defaultConnectTimeout}
	err := a.main(ctx, args)
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		ee = classify(err)
	}
	if ee.msg != "" {
		fmt.Fprintf(stderr, "dlock: %s\n", oneLine(ee.msg))
	}
	if ee.usage != "" {
		printShortUsage(stderr, ee.usage)
	}
	return ee.code
}

// classify gives an unexpected error its exit code.
func classify(err error) *exitError {
	if errors.Is(err, dlock.ErrInvalid) {
		return fail(exitUsage, "%s", strings.TrimPrefix(err.Error(), "dlock: "))
	}
	return fail(exitUnavailable, "%s", strings.TrimPrefix(err.Error(), "dlock: "))
}

func (a *app) main(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("dlock", flag.ContinueOnError)
	a.globalFlags(fs)
	var version bool
	fs.BoolVar(&version, "version", false, "")
	if err := a.parse(fs, "", args); err != nil {
		return err
	}
	if version {
		return cmdVersion(ctx, a, nil)
	}
	if fs.NArg() == 0 {
		return usageErr("", "no command given")
	}
	name, rest := fs.Arg(0), fs.Args()[1:]
	cmd := lookupCommand(name)
	if cmd == nil {
		msg := fmt.Sprintf("unknown command %q", shorten(name, 40))
		var names []string
		for _, c := range commandList() {
			names = append(names, c.name)
		}
		if s, ok := closest(name, names); ok {
			msg += "; did you mean " + s + "?"
		}
		return usageErr("", "%s", msg)
	}
	return cmd.run(ctx, a, rest)
}

// globalFlags adds the flags every command takes; they may come before the
// command's name or after it.
func (a *app) globalFlags(fs *flag.FlagSet) {
	fs.StringVar(&a.backend, "backend", a.backend, "")
	fs.StringVar(&a.passwordFile, "password-file", a.passwordFile, "")
	durationVar(fs, &a.connectTimeout, "connect-timeout", a.connectTimeout)
}

// newFlagSet returns a command's flag set, with the global flags.
func (a *app) newFlagSet(cmd string) *flag.FlagSet {
	fs := flag.NewFlagSet("dlock "+cmd, flag.ContinueOnError)
	a.globalFlags(fs)
	return fs
}

// parse parses args into fs, printing nothing itself: -h gives the command's
// help on stdout, a bad flag an exit-64 error with the usage. cmd is "" for
// dlock's own flags.
func (a *app) parse(fs *flag.FlagSet, cmd string, args []string) error {
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	switch {
	case errors.Is(err, flag.ErrHelp):
		printHelp(a.stdout, cmd)
		return &exitError{code: exitOK}
	case err != nil:
		return usageErr(cmd, "%s", flagError(fs, err))
	}
	if a.connectTimeout <= 0 {
		return usageErr(cmd, "--connect-timeout must be positive, not %v", a.connectTimeout)
	}
	return nil
}

// splitArgs separates the flags in args from the positional arguments, so
// that flags may follow them ("dlock ls PREFIX --json"), which the flag
// package alone does not allow. The first "--" ends the flags; what follows
// it is returned as tail, and dash reports whether there was one. first is
// the index in args of the first positional argument, or -1.
func splitArgs(fs *flag.FlagSet, args []string) (flags, positional, tail []string, dash bool, first int) {
	first = -1
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			return flags, positional, args[i+1:], true, first
		}
		if len(arg) < 2 || arg[0] != '-' {
			if first < 0 {
				first = i
			}
			positional = append(positional, arg)
			continue
		}
		flags = append(flags, arg)
		name := strings.TrimPrefix(strings.TrimPrefix(arg, "-"), "-")
		if strings.Contains(name, "=") {
			continue
		}
		if f := fs.Lookup(name); f != nil && !isBoolFlag(f) && i+1 < len(args) {
			i++
			flags = append(flags, args[i])
		}
	}
	return flags, positional, nil, false, first
}

func isBoolFlag(f *flag.Flag) bool {
	b, ok := f.Value.(interface{ IsBoolFlag() bool })
	return ok && b.IsBoolFlag()
}

// parseCommand parses a command's args, flags anywhere, and returns its
// positional arguments ("--" only stops flag parsing).
func (a *app) parseCommand(fs *flag.FlagSet, cmd string, args []string) ([]string, error) {
	flags, positional, tail, _, _ := splitArgs(fs, args)
	if err := a.parse(fs, cmd, flags); err != nil {
		return nil, err
	}
	positional = append(positional, fs.Args()...)
	return append(positional, tail...), nil
}

// backendURL returns the backend to use: --backend, else DLOCK_BACKEND, else
// the default SQLite file (whose directory it creates unless a.readOnly).
func (a *app) backendURL() (*backendURL, error) {
	raw, source := a.backend, "--backend"
	if raw == "" {
		raw, source = os.Getenv(envBackend), envBackend
	}
	raw = strings.TrimSpace(raw)
	pw, pwSource, err := a.password()
	if err != nil {
		return nil, err
	}
	if raw == "" {
		if pwSource == "--password-file" {
			return nil, passwordErr(pwSource, errors.New("the default SQLite file takes no password"))
		}
		return defaultBackend(!a.readOnly)
	}
	b, err := parseBackendURL(raw)
	if err != nil {
		return nil, fail(exitUsage, "%s %q: %s", source, redact(raw), err)
	}
	if pw != "" {
		if b.kind == kindSQLite && pwSource == envPassword {
			return b, nil // DLOCK_PASSWORD is for the servers it is set for
		}
		if err := b.setPassword(pw); err != nil {
			return nil, passwordErr(pwSource, err)
		}
	}
	return b, nil
}

// open connects to the backend, within --connect-timeout.
func (a *app) open(ctx context.Context) (*store, error) {
	b, err := a.backendURL()
	if err != nil {
		return nil, err
	}
	return connect(ctx, b, a.connectTimeout)
}
