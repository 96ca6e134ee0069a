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
or a file named by --password-file (readable by you alone). dlock run hands
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

const runHelp = `usage: dlock run [flags] NAME -- COMMAND [ARGS...]
       dlock run [flags] NAME

Runs COMMAND while holding the lock NAME, and releases the lock when every
process of COMMAND's process group has ended.

Without a COMMAND, dlock takes the lock, prints its fence on stdout and holds
it, renewed, until a signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1 or
SIGUSR2) or the end of the process that started it, then releases it and
exits 0, so that a shell script can hold it around several commands (as
etcdctl lock does). In bash:
  coproc dlock run --wait 1m NAME
  pid=$COPROC_PID; trap 'kill $pid 2>/dev/null' EXIT
  read -r fence <&"${COPROC[0]}" || { wait "$pid"; exit; }  # not obtained
  ... commands ...
  kill "$pid"; wait "$pid"
If the lock is lost meanwhile, dlock exits 76 and says so, but cannot stop the
script's commands, which are not its own: prefer a COMMAND
(dlock run NAME -- sh -c '...') where you can.

dlock takes the lock, waiting up to --wait for it, then starts COMMAND in a
process group of its own, with DLOCK_NAME (the lock's name), DLOCK_FENCE (its
fencing token, larger than that of every earlier holder), DLOCK_OWNER (the
owner string others see) and DLOCK_KIND (exclusive, fair, shared or
semaphore: the kind of lock held) added to its environment. SIGINT, SIGTERM,
SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to dlock are passed on to that
process group (followed by SIGCONT for the first four, so that a stopped
process gets them). dlock renews the lease every TTL/3 while COMMAND runs,
and exits with COMMAND's exit status.

Kinds of lock (at most one of the flags):
  (none)          exclusive: one holder at a time. This is also the write side
                  of a read-write lock: it waits until no reader holds NAME,
                  and once it waits, new readers wait behind it.
  --fair          exclusive, granted in the order the waiters arrived; give
                  --fair to every run on NAME (a run without it may overtake
                  the queue).
  --shared        a reader: any number of --shared runs hold NAME together,
                  never with an exclusive holder.
  --semaphore N   one of N permits: at most N such runs hold NAME together.
                  N is this run's; give the same N to every run on NAME.
Each reader and permit holder has a lease of its own, with its own fence.
The kinds share one name: an exclusive run on NAME excludes its readers and
permit holders too. A store without the kind refuses the flag (exit 64):
Redlock (redlock://) has no semaphores and no fair locks.

When COMMAND exits but processes it started in the background are still
running in its process group (cmd &), dlock keeps holding and renewing the
lock until they have ended too, and says so after a second; it exits with
COMMAND's status then. A process that leaves the group (setsid, or a daemon
that detaches) is not covered: the lock may be released, and taken by
another, while it runs.

If the lock is lost while COMMAND's group runs (the lock was deleted or broken
with 'dlock release --force', a renewal was refused, or the store could not be
reached for too long), dlock sends SIGTERM to the group, then SIGKILL after
--kill-grace, and exits 76. It starts early enough for the group to be gone
before the lease can have expired on the store: at the lease's local deadline
minus --kill-grace minus 250ms. Pass $DLOCK_FENCE to what COMMAND writes to,
so that it can refuse writes from a holder whose lease ran out.

A holder that dies without releasing (kill -9, a crash) leaves the lock on
the store until its TTL runs out. On Linux, dlock tells when the holder was a
process of this host (same boot, PID and time namespaces) that has ended,
from the owner string (its PID and start time), and says so; with
--take-over-dead it takes such a lock over at once, as flock frees a dead
holder's lock: it breaks that holder's grant, and only that one (the store
compares its fence). It is off by default because what dlock can see is the
holder's process, not its work: processes its COMMAND left in the background
live on after dlock is killed, a library process that shares an owner ID
with others (WithOwnerID) leaves the grant to them, and VM snapshots cloned
from one machine share its boot id. Give it where the holder's work ends with
its process. A holder on another host, or whose state dlock cannot read, is
waited for; a grant with a lock-delay, Redlock, readers and permit holders
are never taken over.

If dlock itself is killed (kill -9), Linux kills COMMAND's own process with
SIGKILL, unless it is a set-user-ID program such as sudo (Linux then drops
that signal). The other processes of its group, and COMMAND on other systems,
run on unprotected. A dlock stopped with SIGSTOP does not renew the lease,
and does not stop COMMAND when the lease expires meanwhile. Run dlock under a
supervisor that kills the whole process group if you need more.

While it waits, dlock says on stderr what keeps the lock from it (the holder,
held for, expires in; "a writer is waiting" for a reader; "5 of 5 permits in
use"; "2 readers hold it"; with --fair, its place in the queue, "3rd in the
queue"), and again whenever that changes ("now held by" for a new holder);
when stderr is a terminal it also keeps a line showing how long it has
waited. A plain run that waits is also put in the name's queue after a
moment, where the store allows it, so that runs that release and lock again
at once cannot starve it; it shows no place, as it asked for no order.

In the foreground of a terminal, with the terminal as stdin, COMMAND gets the
terminal: it can read from it, and Ctrl-C reaches it directly. Otherwise
COMMAND runs in the background, and a process of it that reads from the
terminal (sudo asking for a password, for one) is stopped by the system.
While the lock is held, COMMAND is not left stopped, nor dlock: the lease
would lapse, or be kept, for a command that is not running. Ctrl-Z is
answered with a message; a stopped process of COMMAND's group is continued
(on Linux), and a group that stops again each time it is continued is ended
like one whose lock was lost (SIGTERM, then SIGKILL after --kill-grace), and
dlock exits with its status, never 0.

Flags:
  --ttl DURATION             the lease's time to live on the store (default 10s)
  --wait DURATION            longest wait for the lock; 0 tries once, "forever"
                             waits without limit (default 0); --timeout is
                             the same flag, under flock's name, and also
                             takes flock's bare seconds (--timeout 5)
  -E, --conflict-exit-code N exit status when the lock is not obtained
                             (default 75); with 0 a busy lock is a success, and
                             dlock says nothing of it unless --verbose (as
                             flock -n -E 0 does: cron mails nothing)
  -q, --quiet                no messages about waiting, about a lock not
                             obtained or a command ended by a signal; errors
                             and warnings are still printed
  -v, --verbose              also say when the lock was obtained (its fence,
                             the time waited) and released
  --take-over-dead           take over at once a lock whose holder, a process
                             of this host, has ended (Linux; see below)
  --kill-grace DURATION      time between SIGTERM and SIGKILL when the lock is
                             lost (default 2s); --kill-grace plus 250ms must be
                             at most half of --ttl, so a --ttl under 4.5s
                             shortens the default to fit, down to 100ms: the
                             shortest --ttl is 700ms
  --metadata TEXT            free text stored with the lock and shown to waiters
                             and by 'dlock ls' (at most 512 bytes)
  --lock-delay DURATION      if the lease expires without a release (dlock was
                             paused or cut off from the store), keep the lock
                             from others for this much longer (default 0; Redis,
                             Redlock only; not with --shared or --semaphore)
  --fair                     a fair exclusive lock: waiters get it in order
  --shared                   a shared (read) lock: exclusive runs wait for it
  --semaphore N              one of N permits (N from 1 to 1048576)
` + backendFlagsHelp + `
DLOCK_TTL and DLOCK_WAIT, when set, are the defaults of --ttl and --wait.
Durations take a unit: 500ms, 30s, 5m, 1h. A --ttl over a day draws a
warning: a dlock that dies keeps the lock taken that long.

Exit status:
  N       COMMAND's own exit status
  128+N   COMMAND was killed by signal N (dlock says so, unless the signal
          came through dlock, or is SIGPIPE), or dlock was interrupted by
          signal N while it waited for the lock
  64      usage error: bad flags, lock name or backend URL, or a kind of
          lock the store does not have
  69      the store could not be reached or failed; without a COMMAND, also
          when the release failed (the lock expires on the store by itself)
  77      the store refused the credentials (user, password) or the rights
          (a Redis ACL, a SQLite file dlock cannot write)
  78      bad configuration: the store lacks what the URL names (a database),
          a Redis may evict lock keys (maxmemory-policy), or neither HOME
          nor XDG_STATE_HOME is set for the default store
  74      without a COMMAND: the fence could not be written on stdout (its
          reader is gone); the lock was released
  75      the lock was not obtained within --wait (the message names the
          holder), or the status --conflict-exit-code gives instead
  76      the lock was lost while COMMAND ran, and COMMAND was stopped (or
          the lock was found lost when COMMAND ended, or before it started:
          COMMAND was then not run)
  126     COMMAND could not be executed
  127     COMMAND was not found
COMMAND may itself exit with one of these numbers; dlock's message on stderr
tells the cases apart.

Examples:
  dlock run nightly-report -- ./report.sh
  dlock run --wait 5m --ttl 30s deploy -- make deploy
  dlock run -E 0 nightly -- ./job.sh    # in cron: a busy lock is a silent skip
  dlock run --backend redis://cache:6379/0 orders:42 -- sh -c 'echo "fence $DLOCK_FENCE"'
  dlock run --shared --wait 1m catalog -- ./read-catalog.sh
  dlock run --wait 10m catalog -- ./rebuild-catalog.sh   # after the readers
  dlock run --semaphore 3 --wait forever encoders -- ffmpeg -i in.mov out.mp4
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
process would; all run on this machine, timed by one clock.

Subjects (--subjects):
  dlock           dlock's exclusive lock, as 'dlock run' takes it
  dlock-fair      the fair lock (--fair); not on stores without fair locks
                  (Redlock)
  raw             the floor a lock on that store is measured against: SET NX
                  PX retried at once while taken, and a compare-and-delete
                  script (Redis); INSERT of the name retried at once, and a
                  DELETE (SQL, in the table dlock_bench_raw, which it
                  creates). No expiry, fencing, renewal or waking: not a lock
                  to use. Redlock has none; its baselines are per node.
Workloads (--workloads), each run for --duration:
  uncontended     one worker on one name, no critical section
  hot             --workers workers on one name, once for each --cs
  keys            --workers workers over --names names, 100us critical section
A worker locks again as soon as it has released. The critical section is a
busy loop, as work would be. Before the runs, dlock times 1000 round trips:
PING on Redis (on each node for Redlock), SELECT 1 on SQL.

The report, per subject and workload: grants per second; the wait in Lock
(p50, p99, p99.9, in µs); the waits during which another worker got the
name (blocked: p99, count); the handoff, from a release to a worker already
waiting getting the lock (p50, p99, count); Jain's fairness index of the
grants over the workers (1 when equal); the client's round trips per grant
(Redis); the commands the store served per grant (Redis, from INFO
commandstats, counting other clients' commands too) or the statements the
workers sent (SQL); and the errors. Compare numbers of one run only: a shared
or busy machine makes them vary from one run to the next.

The runs lock names under dlock-bench/ on the store. Interrupting dlock
(Ctrl-C) ends the runs; the locks held are released.

Flags:
  --subjects LIST            comma list of dlock, dlock-fair, raw (default all)
  --workloads LIST           comma list of uncontended, hot, keys (default all)
  --workers N                workers of hot and keys (default 8)
  --names N                  lock names of keys (default 64)
  --cs LIST                  critical sections of hot, a comma list of
                             durations (default 0,100us,1ms,10ms)
  --duration DURATION        length of each run (default 2s)
  --json                     a JSON array of reports, one per store: machine,
                             store, started, baselines (percentiles in ns),
                             results (one per subject and workload, durations
                             in ns), notes (subjects the store cannot have)
` + backendFlagsHelp + `
On a terminal, a line on stderr shows the run under way.

Exit status: 0; 64 for a usage error; 69 when a store cannot be reached or
fails, or when a run had errors (the report is printed first); 77 when a
store refuses the credentials, 78 for a bad configuration; 128+N when
interrupted by signal N.

Examples:
  dlock bench
  dlock bench --workloads hot --cs 100us --duration 5s redis://localhost:6379/0
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
