// Package cli is the dlock command: it maps backend URLs to backends and runs
// the subcommands (run, ls, inspect, release, bench, completion, version,
// help), on spf13/cobra and pflag. cmd/dlock only calls Main;
// cmd/dlock-gen-man writes man pages from Command.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// envBackend names the environment variable that gives the backend URL when
// --backend is not set.
const envBackend = "DLOCK_BACKEND"

// app is one invocation of dlock: where it writes and the global flags.
type app struct {
	stdout, stderr io.Writer

	backend        string // --backend; "" means DLOCK_BACKEND, then the default
	passwordFile   string // --password-file; "" means DLOCK_PASSWORD, if set
	warned         bool   // the password warnings were given (once a process)
	connectTimeout time.Duration
	// readOnly: the command only reads the store (ls, inspect) or finds
	// nothing to do on an empty one (release), and must not create a
	// SQLite file or its directory.
	readOnly bool
	// cmdArgs are the arguments as given, less the command's name: run
	// reads them to tell "dlock run NAME cmd -x" (no "--") from a flag.
	cmdArgs []string
	// logFormat is --log-format: how dlock's own messages are written
	// (see msgs).
	logFormat string
	jsonOnce  sync.Once
	json      *jsonLines
}

// runner runs a command with the arguments its flags left: args, and dash,
// the number of them before "--" (-1 without one).
type runner func(ctx context.Context, args []string, dash int) error

// command is a subcommand: define adds its flags to fs and returns what runs
// it with their values.
type command struct {
	name    string
	summary string
	define  func(a *app, fs *pflag.FlagSet) runner
}

// commandList returns the subcommands in the order help shows them.
func commandList() []command {
	return []command{
		{"run", "run a command while holding a lock", runCommand},
		{"ls", "list held locks", lsCommand},
		{"inspect", "show one lock", inspectCommand},
		{"release", "break a lock held by someone else (--force)", releaseCommand},
		{"bench", "measure lock latency and throughput on a store", benchCommand},
		{"top", "live view of a store's held locks and waiters", topCommand},
		{"dash", "web dashboard of a store's locks, with /metrics", dashCommand},
		{"completion", "print a shell completion script (bash, zsh, fish)", completionCommand},
		{"version", "print dlock's version", versionCommand},
		{"help", "show help for dlock or a command", helpCommand},
	}
}

// commandNames returns the names of the subcommands.
func commandNames() []string {
	var names []string
	for _, c := range commandList() {
		names = append(names, c.name)
	}
	return names
}

// Main runs dlock with args (without the program name), writing to stdout
// and stderr, and returns the exit code. Errors are printed as one line on
// stderr, never as a stack trace.
func Main(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	a := &app{stdout: stdout, stderr: stderr, connectTimeout: defaultConnectTimeout}
	root := a.rootCommand()
	args, perr := beforeCommand(root, args)
	if perr != nil {
		fmt.Fprintf(stderr, "dlock: %s\n", perr.msg)
		printShortUsage(stderr, perr.usage)
		return perr.code
	}
	root.SetArgs(args)
	if _, rest, err := root.Find(args); err == nil {
		a.cmdArgs = rest
	}
	err := root.ExecuteContext(ctx)
	if err == nil {
		return exitOK
	}
	var ee *exitError
	if !errors.As(err, &ee) {
		ee = classify(err)
	}
	if j, ok := a.msgs().(*jsonLines); ok {
		j.failure(oneLine(ee.msg), synopses[ee.usage], ee.code)
		return ee.code
	}
	if ee.msg != "" {
		fmt.Fprintf(stderr, "dlock: %s\n", oneLine(ee.msg))
	}
	if ee.usage != "" {
		printShortUsage(stderr, ee.usage)
	}
	return ee.code
}

// beforeCommand checks the arguments before the command's name: only the
// global flags may come there (cobra would take a command's flag with a
// value, "dlock --ttl 7s run", as the command's), and a "--" there, which
// the old flag package skipped, is dropped.
func beforeCommand(root *cobra.Command, args []string) ([]string, *exitError) {
	for i := 0; i < len(args); i++ {
		arg := args[i]
		switch {
		case arg == "--":
			return append(append([]string(nil), args[:i]...), args[i+1:]...), nil
		case len(arg) < 2 || arg[0] != '-':
			return args, nil // the command's name
		}
		name, hasValue := strings.TrimLeft(arg, "-"), false
		if n, _, ok := strings.Cut(name, "="); ok {
			name, hasValue = n, true
		}
		var f *pflag.Flag
		if strings.HasPrefix(arg, "--") {
			f = root.PersistentFlags().Lookup(name)
			if f == nil {
				f = root.Flags().Lookup(name)
			}
		} else if len(name) == 1 {
			f = root.PersistentFlags().ShorthandLookup(name)
			if f == nil {
				f = root.Flags().ShorthandLookup(name)
			}
		}
		if f == nil {
			if name == "h" || name == "help" {
				return args, nil // cobra's own
			}
			return nil, usageErr("", "unknown flag %s before the command; a command's flags go after its name (dlock COMMAND %s ...)", shorten(arg, 40), shorten(arg, 40))
		}
		if f.Value.Type() != "bool" && !hasValue {
			i++ // its value
		}
	}
	return args, nil
}

// Command returns the dlock command tree, as Main runs it, for tools that
// generate documentation from it (cmd/dlock-gen-man).
func Command() *cobra.Command {
	a := &app{stdout: os.Stdout, stderr: os.Stderr, connectTimeout: defaultConnectTimeout}
	return a.rootCommand()
}

// classify gives an unexpected error its exit code.
func classify(err error) *exitError {
	if errors.Is(err, dlock.ErrInvalid) || errors.Is(err, dlock.ErrConflict) {
		return fail(exitUsage, "%s", strings.TrimPrefix(err.Error(), "dlock: "))
	}
	return fail(exitUnavailable, "%s", strings.TrimPrefix(err.Error(), "dlock: "))
}

// rootCommand builds the dlock command and its subcommands on spf13/cobra.
// dlock keeps its own help texts, usage lines and error messages: cobra
// parses (with pflag), finds the command, and completes.
func (a *app) rootCommand() *cobra.Command {
	var version bool
	root := &cobra.Command{
		Use:                   synopses["dlock"], // the man page's SYNOPSIS
		Short:                 "run commands under distributed locks",
		Long:                  docText(""),
		Args:                  cobra.ArbitraryArgs,
		SilenceErrors:         true,
		SilenceUsage:          true,
		DisableFlagsInUseLine: true,
		CompletionOptions:     cobra.CompletionOptions{DisableDefaultCmd: true},
		RunE: func(cmd *cobra.Command, args []string) error {
			switch {
			case version:
				return versionCommand(a, nil)(cmd.Context(), nil, -1)
			case len(args) == 0:
				return usageErr("", "no command given")
			}
			msg := fmt.Sprintf("unknown command %q", shorten(args[0], 40))
			if s, ok := closest(args[0], commandNames()); ok {
				msg += "; did you mean " + s + "?"
			}
			return usageErr("", "%s", msg)
		},
		PersistentPreRunE: func(cmd *cobra.Command, _ []string) error {
			if a.connectTimeout <= 0 {
				return usageErr(usageName(cmd), "--connect-timeout must be positive, not %v", a.connectTimeout)
			}
			if a.logFormat != logText && a.logFormat != logJSON {
				f := a.logFormat
				a.logFormat = logText // the error itself as text
				return usageErr(usageName(cmd), "--log-format %q: want text or json", f)
			}
			return nil
		},
	}
	a.globalFlags(root.PersistentFlags())
	root.Flags().BoolVar(&version, "version", false, "print dlock's version")
	root.SetOut(a.stdout)
	root.SetErr(a.stderr)
	root.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		if cmd.Name() == "run" {
			if err := putDashBetween(cmd.Flags(), a.cmdArgs); err != nil {
				return err
			}
		}
		return flagError(usageName(cmd), cmd.Flags(), err)
	})
	root.SetHelpFunc(func(cmd *cobra.Command, _ []string) {
		printShortHelp(a.stdout, cmd)
	})
	for _, c := range commandList() {
		cmd := &cobra.Command{
			Use:                   strings.TrimPrefix(synopses[c.name], "dlock "),
			Short:                 c.summary,
			Long:                  docText(c.name),
			DisableFlagsInUseLine: true,
		}
		run := c.define(a, cmd.Flags())
		cmd.RunE = func(cmd *cobra.Command, args []string) error {
			return run(cmd.Context(), args, cmd.ArgsLenAtDash())
		}
		switch c.name {
		case "help":
			cmd.ValidArgsFunction = func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
				return commandNames(), cobra.ShellCompDirectiveNoFileComp
			}
			root.SetHelpCommand(cmd)
		case "inspect", "release", "run":
			cmd.ValidArgsFunction = a.completeLockName
			root.AddCommand(cmd)
		case "completion":
			cmd.ValidArgs = completionShells
			cmd.ValidArgsFunction = func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
				return completionShells, cobra.ShellCompDirectiveNoFileComp
			}
			root.AddCommand(cmd)
		default:
			root.AddCommand(cmd)
		}
	}
	root.InitDefaultHelpCmd()
	completeFlagValues(root)
	return root
}

// usageName is the name printShortUsage and printHelp know cmd by: "" for
// dlock itself.
func usageName(cmd *cobra.Command) string {
	if !cmd.HasParent() {
		return ""
	}
	return cmd.Name()
}

// globalFlags adds the flags every command takes; they may come before the
// command's name or after it.
func (a *app) globalFlags(fs *pflag.FlagSet) {
	fs.StringVar(&a.backend, "backend", a.backend, "the store's URL (default $DLOCK_BACKEND, else a SQLite file in your state directory)")
	fs.StringVar(&a.passwordFile, "password-file", a.passwordFile, "read the store's password from the file's first line (default $DLOCK_PASSWORD)")
	durationVar(fs, &a.connectTimeout, "connect-timeout", a.connectTimeout, "longest wait for the store's first answer")
	fs.StringVar(&a.logFormat, "log-format", logText, "how dlock writes its own messages on stderr: text or json")
}

// splitArgs separates the flags in args from the positional arguments as
// pflag reads them, without parsing the values: run uses it to tell a
// command given without "--" from a mistyped flag, and to see which
// spelling of a flag was given. The first "--" ends the flags; what follows
// it is tail, and dash reports whether there was one. first is the index in
// args of the first positional argument, or -1. spelled has each flag as
// written ("--quiet", "-q"; "-q" and "-v" for "-qv").
func splitArgs(fs *pflag.FlagSet, args []string) (s argSplit) {
	s.first = -1
	s.spelled = map[string]bool{}
	for i := 0; i < len(args); i++ {
		arg := args[i]
		if arg == "--" {
			s.tail, s.dash = args[i+1:], true
			return s
		}
		if len(arg) < 2 || arg[0] != '-' {
			if s.first < 0 {
				s.first = i
			}
			s.positional = append(s.positional, arg)
			continue
		}
		s.flags = append(s.flags, arg)
		if long, ok := strings.CutPrefix(arg, "--"); ok {
			name, _, eq := strings.Cut(long, "=")
			s.spelled["--"+name] = true
			if f := fs.Lookup(name); f != nil && !eq && f.NoOptDefVal == "" && i+1 < len(args) {
				i++
				s.flags = append(s.flags, args[i])
			}
			continue
		}
		group := arg[1:]
		for j := 0; j < len(group); j++ {
			c := group[j : j+1]
			s.spelled["-"+c] = true
			f := fs.ShorthandLookup(c)
			if f == nil {
				break
			}
			if f.NoOptDefVal == "" {
				if j+1 == len(group) && i+1 < len(args) {
					i++
					s.flags = append(s.flags, args[i])
				}
				break
			}
		}
	}
	return s
}

// argSplit is what splitArgs found.
type argSplit struct {
	flags, positional, tail []string
	dash                    bool
	first                   int
	spelled                 map[string]bool
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
	if source == "--backend" && len(b.secrets) > 0 && !a.warned {
		fmt.Fprintln(a.msgs(), "dlock: warning: the password in --backend is visible to other users of this host (ps); give it in DLOCK_PASSWORD or a --password-file")
	}
	a.warned = true
	if pw != "" {
		if b.kind == kindSQLite && pwSource == envPassword {
			return b, nil // DLOCK_PASSWORD is for the servers it is set for
		}
		if err := b.setPassword(pw); err != nil {
			return nil, passwordErr(pwSource, err)
		}
	}
	switch user, sentinel := b.redisUserWithoutPassword(); {
	case sentinel:
		return nil, fail(exitUsage, "%s %q names the sentinels' user %q (sentinel_username) but no sentinel_password; "+
			"Redis signs a user in only with a password (any, for a user with nopass)", source, redact(raw), user)
	case user != "":
		return nil, fail(exitUsage, "%s %q names the Redis user %q but no password, and Redis signs a user in only with one "+
			"(any, for a user with nopass): give it in %s or a --password-file; without it dlock would connect as the default user",
			source, redact(raw), user, envPassword)
	}
	return b, nil
}

// open connects to the backend, within --connect-timeout.
func (a *app) open(ctx context.Context) (*store, error) {
	return a.openFor(ctx, nil)
}

// openFor is open for a command that needs what check, when not nil, vets
// in the backend (see connectHooks.check), before the store is reached.
func (a *app) openFor(ctx context.Context, check func(be driver.Backend, where string) error) (*store, error) {
	b, err := a.backendURL()
	if err != nil {
		return nil, err
	}
	return connectHooked(ctx, b, a.connectTimeout, connectHooks{readOnly: a.readOnly, check: check, log: a.libLogger()})
}
