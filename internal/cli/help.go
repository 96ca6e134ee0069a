// The help texts of dlock and its commands, and the help command.

package cli

import (
	"context"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/pflag"
)

// synopses are the usage lines, printed after a usage error.
var synopses = map[string]string{
	"dlock":      "dlock [--backend URL] [--password-file PATH] [--connect-timeout DURATION] [--log-format text|json] COMMAND [ARGS...]",
	"run":        "dlock run [flags] NAME [-- COMMAND [ARGS...]]",
	"ls":         "dlock ls [PREFIX] [--json]",
	"inspect":    "dlock inspect NAME [--json]",
	"release":    "dlock release --force NAME [--json]",
	"bench":      "dlock bench [flags] [URL...]",
	"top":        topSynopsis,
	"dash":       dashSynopsis,
	"completion": "dlock completion bash|zsh|fish",
	"version":    "dlock version",
	"help":       "dlock help [COMMAND]",
}

const backendFlagsHelp = `  --backend URL              the store (default: $DLOCK_BACKEND, else the
                             SQLite file in your state directory, private to
                             your user; see 'dlock help')
  --password-file PATH       the store's password, read from the file's first
                             line (default: $DLOCK_PASSWORD), for a URL
                             without one: a password in --backend is on the
                             command line, which ps shows to every user
  --connect-timeout DURATION longest wait for the store's first answer (default 5s)
  --log-format text|json     how dlock writes its own messages on stderr: lines
                             of text (default), or one JSON object per message
                             (time, level, msg; exit and usage for the error
                             a command ends with); a command's own stderr
                             passes through as it is
`

const overviewHelp = `dlock runs commands under distributed locks and shows who holds them.

usage: ` + "%s" + `

Commands:
%s
Backends (--backend URL, or the DLOCK_BACKEND environment variable):
  sqlite:///abs/path/locks.db        SQLite file (three slashes: absolute path)
  sqlite:rel/path/locks.db           SQLite file relative to the current directory
  redis://[user@]host:6379/0         one Redis node; rediss:// for TLS
  redis+sentinel://[user@]h1:26379,h2:26379/MASTER[?db=N]
                                     Redis via Sentinel; user and password are the
                                     master's (sentinel_username= and
                                     sentinel_password= parameters for the sentinels)
  redis+cluster://[user@]h1:7000,h2:7001
                                     Redis Cluster
  redlock://[user@]h1:6379,h2:6379,h3:6379[/db][?node_timeout=50ms]
                                     three or more independent Redis nodes, a lock
                                     held by a majority of them (docs/REDLOCK.md)
  mysql://user@host:3306/dbname      MySQL or MariaDB
  postgres://user@host:5432/dbname
                                     PostgreSQL (also postgresql://)
  etcd://[user@]h1:2379,h2:2379,h3:2379[?namespace=dlock/]
                                     etcd, the members of one cluster; etcds:// (or
                                     tls=1) for TLS, with ca=FILE, cert=FILE&key=FILE,
                                     insecure_skip_verify=1; op_timeout=3s bounds each
                                     call; handoff=0 while older dlock versions share
                                     the namespace (docs/ETCD.md)
The three Redis forms take replica_ack=N (and replica_ack_timeout=100ms): every
grant and renewal waits until N replicas have it, so a failover keeps the lock.
dlock refuses a Redis whose maxmemory-policy is not noeviction (it could evict
a held lock or a fence counter); allow_eviction=1, on any Redis form, accepts
that risk.
Keep passwords out of the URL: a --backend URL stands on the command line,
where ps shows it to every user of the machine for as long as dlock runs. Give
the user in the URL (redis://app@h:6379/0) and the password in DLOCK_PASSWORD
or a file named by --password-file (readable by you alone); a Redis user
without a password is refused, since Redis would take the connection for its
default user's (a user with nopass takes any password). dlock run hands
the command neither DLOCK_PASSWORD nor a DLOCK_BACKEND that holds a password.
Percent-encode '/', '?', '#' and '@' in passwords (%%2F, %%3F, %%23, %%40).

With no backend given, dlock keeps its locks in the SQLite file
$XDG_STATE_HOME/dlock/locks.db (~/.local/state/dlock/locks.db when
XDG_STATE_HOME is not set), created on first use in a directory only its user
can enter: locks between the processes of one user, with no server to run.
Other users, root (sudo dlock ...) and their cron jobs have files of their own
and do not see those locks. For locks between the users of one machine, give
them all one file, in a directory they can all write (SQLite adds files beside
it), for example DLOCK_BACKEND=sqlite:///var/lib/dlock/locks.db with
/var/lib/dlock owned by their group, group-writable and set-group-ID
(chgrp GROUP /var/lib/dlock; chmod 2775 /var/lib/dlock): dlock then creates
locks.db group-writable, and SQLite its -wal and -shm files alike. Between
machines, a server. 'dlock ls', 'inspect' and 'release' never create the file:
where there is none, no lock is held.

Global flags (also accepted after the command's name):
` + backendFlagsHelp + `
Run 'dlock help COMMAND' for a command's flags and exit status.
`

const lsHelp = `usage: dlock ls [PREFIX] [--json]

Lists the held locks whose names start with PREFIX (all of them without one):
name, owner, fence, how long it has been held, when it expires unless renewed,
and the hold count. It prints "no locks held" when there are none.

The owner columns describe the exclusive holder ("-" for a lock held only by
readers or permit holders). When some lock has shared holds or waiters, two
columns follow: SHARED ("2 readers", or "3/5 permits" for a semaphore) and
WAITING ("writer" when a writer waits for the readers, "2 queued" for the
waiters in the name's queue: those of --fair runs, and plain waiters that
dlock queued so that they are not starved). 'dlock inspect NAME' lists the
shared holders.

Flags:
  --json                     one JSON array of objects for scripts, [] when
                             none. A value that is absent or unknown is null.
                             name; held (true); for the exclusive holder (each null when
                             there is none): owner, owner_info, fence, holds,
                             held_for_ms, expires_in_ms; in_lock_delay;
                             shared, the readers or permit holders, each with
                             owner, owner_info, fence, held_for_ms and
                             expires_in_ms ([] when none); limit, the
                             semaphore's permits (null otherwise); queued,
                             the queue's length (as WAITING counts it);
                             writer_waiting. owner_info is the owner string
                             in its parts: host, pid, client (the process's
                             dlock client, from 1), acquired_at (RFC 3339),
                             metadata (null when none; it may hold '|'); null
                             for an owner dlock did not write
` + backendFlagsHelp + `
Exit status: 0, 64 for a usage error, 69 when the store cannot be reached,
77 when it refuses the credentials, 78 for a bad configuration (see 'dlock
help run').
`

const inspectHelp = `usage: dlock inspect NAME [--json]

Shows the lock NAME as 'dlock ls' does, or says that it is not held. A lock
with readers or permit holders is followed by a table of them: owner, fence,
held for, expires in.

Flags:
  --json                     one JSON object: the fields of 'dlock ls --json'
                             and "held"; {"name": NAME, "held": false} when
                             the lock is not held
` + backendFlagsHelp + `
Exit status: 0 when the lock is held, 1 when it is not, 64 for a usage error,
69 when the store cannot be reached, 77 when it refuses the credentials, 78
for a bad configuration.
`

const releaseHelp = `usage: dlock release --force NAME [--json]

Breaks the lock NAME whoever holds it, wakes its waiters, and says whose lock
it broke (owner and fence; each reader or permit holder of a shared lock), or
that it was not held. The waiters of a fair lock keep their places.

The holder is not told at once: it goes on believing it holds the lock until
its next renewal (within a third of its TTL) is refused; a 'dlock run' holder
then stops its command. Until then two holders may work at the same time, so
--force is required: use it for a holder that is gone or stuck. The next
holder gets a larger fence, which is what lets a fenced resource refuse the
old holder's late writes.

Flags:
  --force                    required: really break the lock
  --json                     one JSON object: name; released (false when it
                             was not held); lock, the lock as it was, with the
                             fields of 'dlock ls --json' (null when not held)
` + backendFlagsHelp + `
Exit status: 0 (also when the lock was not held), 64 for a usage error or
without --force, 69 when the store cannot be reached, 77 when it refuses the
credentials, 78 for a bad configuration.
`

const benchHelp = `usage: dlock bench [flags] [URL...]

Measures how fast locks are taken, released and handed from one holder to
the next on each store URL names (without one, the store of --backend,
DLOCK_BACKEND or the default SQLite file), and prints a report per store.
Each worker has a connection and a dlock client of its own, as a separate
process would (the -pair subjects: two workers to one, as two goroutines of
one service would); all run on this machine, timed by one clock.

Subjects (--subjects):
  dlock           dlock's exclusive lock, as 'dlock run' takes it
  dlock-fair      the fair lock (--fair); not on stores without fair locks
                  (Redlock)
  dlock-pair      dlock, two workers to a client and connection
  dlock-fair-pair dlock-fair, two workers to a client and connection
  raw             the floor a lock on that store is measured against: SET NX
                  PX retried at once while taken, and a compare-and-delete
                  script (Redis); INSERT of the name retried at once, and a
                  DELETE (SQL, in the table dlock_bench_raw, which it
                  creates). No expiry, fencing, renewal or waking: not a lock
                  to use. Redlock has none; its baselines are per node. On
                  Redis it has rw and sem too: a reader's script, refused
                  while the writer's key is there; a writer's, that claims
                  that key and is granted once the readers are gone; a
                  permit script, granted while fewer than --permits hold.
Workloads (--workloads), each run for --duration:
  uncontended     one worker on one name, no critical section
  hot             --workers workers on one name, once for each --cs
  keys            --workers workers over --names names, 100us critical section
  rw              a read-write lock: --workers workers on one name, --writers
                  of them writing, the others reading; 100us critical section
                  (not by default)
  sem             a semaphore of --permits permits: --workers workers on one
                  name, 100us critical section (not by default)
The fair subjects run rw and sem on Redis only (the store with fair
read-write locks and semaphores); Redlock has no sem, SQL and etcd no raw
rw or sem: the report notes each one left out. In rw, blocked waits count a reader only when a writer got the name,
handoffs follow writers' releases only, and Jain is the lower of the
writers' and the readers'; sem has no handoffs (a release frees one of
several permits).
A worker locks again as soon as it has released. The critical section is a
busy loop, as work would be. Before the runs, dlock times 1000 round trips:
PING on Redis (on each node for Redlock), SELECT 1 on SQL.

The report, per subject and workload: grants per second; the wait in Lock
(p50, p99, p99.9, in µs); the waits during which another worker got the
name (blocked: p99, count); the handoff, from a release to a worker already
waiting getting the lock (p50, p99, count); Jain's fairness index of the
grants over the workers (1 when equal); the client's round trips per grant
(Redis); the commands the store served per grant (Redis, from INFO
commandstats, counting other clients' commands too, and the commands
scripts run) and the script calls among them, or the statements the workers
sent (SQL); the CPU time per grant, in µs, of dlock's own process (the
workers' clients and critical sections, and SQLite's work, which runs in
it) and of the store's servers (Redis, from INFO cpu): where they share the cores, that bounds the grants per
second; and the errors. Compare numbers of one run only: a shared
or busy machine makes them vary from one run to the next.

The runs lock names under dlock-bench/ on the store. Interrupting dlock
(Ctrl-C) ends the runs; the locks held are released.

Flags:
  --subjects LIST            comma list of dlock, dlock-fair, dlock-pair,
                             dlock-fair-pair, raw (default all)
  --workloads LIST           comma list of uncontended, hot, keys, rw, sem
                             (default uncontended,hot,keys)
  --workers N                workers of hot, keys, rw and sem (default 8)
  --names N                  lock names of keys (default 64)
  --writers N                workers of rw that write, between 1 and
                             --workers − 1 (default 2)
  --permits N                permits of sem (default 3)
  --cs LIST                  critical sections of hot, a comma list of
                             durations (default 0,100us,1ms,10ms)
  --duration DURATION        length of each run (default 2s)
  --json                     a JSON array of reports, one per store: machine,
                             store, started, baselines (percentiles in ns),
                             results (one per subject and workload, durations
                             in ns), notes (subjects the store cannot have)
  --charts DIR               also write one SVG chart per store and workload
                             into DIR (bench-N-KIND-WORKLOAD.svg): each
                             subject's wait by percentile on a log axis, and
                             its grants per worker
` + backendFlagsHelp + `
On a terminal, a line on stderr shows the run under way.

Exit status: 0; 64 for a usage error; 69 when a store cannot be reached or
fails, or when a run had errors (the report is printed first); 77 when a
store refuses the credentials, 78 for a bad configuration; 128+N when
interrupted by signal N.

Examples:
  dlock bench
  dlock bench --workloads hot --cs 100us --duration 5s redis://localhost:6379/0
  dlock bench --workloads rw,sem --subjects dlock,raw redis://localhost:6379/0
  dlock bench --json redis://localhost:6379/0 postgres://u:p@db/locks > bench.json
`

const versionHelp = `usage: dlock version

Prints dlock's version, the commit it was built from when known, and the Go
version.
`

const helpHelp = `usage: dlock help [COMMAND]

Shows help for dlock, or for COMMAND.
`

var helps = map[string]string{
	"run":        runHelp,
	"ls":         lsHelp,
	"inspect":    inspectHelp,
	"release":    releaseHelp,
	"bench":      benchHelp,
	"top":        topHelp,
	"dash":       dashHelp,
	"completion": completionHelp,
	"version":    versionHelp,
	"help":       helpHelp,
}

// printHelp prints the help of cmd, or dlock's overview for "".
func printHelp(w io.Writer, cmd string) {
	if h, ok := helps[cmd]; ok {
		fmt.Fprint(w, h)
		return
	}
	var list strings.Builder
	for _, c := range commandList() {
		fmt.Fprintf(&list, "  %-10s %s\n", c.name, c.summary)
	}
	fmt.Fprintf(w, overviewHelp, synopses["dlock"], list.String())
}

// docText is the help of cmd ("" for dlock's own) as cobra's generated docs
// (man pages) take it: indented, so that the layout is kept.
func docText(cmd string) string {
	var b strings.Builder
	printHelp(&b, cmd)
	text := b.String()
	if strings.HasPrefix(text, "usage: ") {
		// The usage lines are the page's SYNOPSIS.
		if _, rest, ok := strings.Cut(text, "\n\n"); ok {
			text = rest
		}
	}
	var out strings.Builder
	for line := range strings.Lines(text) {
		if strings.TrimSpace(line) == "" {
			out.WriteString("\n")
			continue
		}
		out.WriteString("    " + line)
	}
	return out.String()
}

// printShortUsage prints the usage line of cmd ("dlock" for dlock's own)
// after a usage error.
func printShortUsage(w io.Writer, cmd string) {
	fmt.Fprintf(w, "usage: %s\n", synopses[cmd])
	if cmd == "dlock" {
		fmt.Fprintln(w, "Run 'dlock help' for the commands and backends.")
		return
	}
	fmt.Fprintf(w, "Run 'dlock help %s' for details.\n", cmd)
}

// helpCommand returns what runs help, which has no flags of its own.
func helpCommand(a *app, _ *pflag.FlagSet) runner {
	return func(_ context.Context, args []string, _ int) error { return cmdHelp(a, args) }
}

func cmdHelp(a *app, args []string) error {
	switch len(args) {
	case 0:
		printHelp(a.stdout, "")
		return nil
	case 1:
		if _, ok := helps[args[0]]; !ok {
			msg := fmt.Sprintf("no help for %q: not a command", printable(args[0], 40))
			if s, ok := closest(args[0], commandNames()); ok {
				msg += "; did you mean " + s + "?"
			}
			return usageErr("help", "%s", msg)
		}
		printHelp(a.stdout, args[0])
		return nil
	}
	return usageErr("help", "help takes at most one command name")
}
