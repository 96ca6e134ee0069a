// The full help text of dlock run.

package cli

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
owner string others see), DLOCK_KIND (exclusive, fair, shared or
semaphore: the kind of lock held; a fair reader or permit is shared or
semaphore) and, for a --fair run of any kind, DLOCK_FAIR=1 added to its
environment (DLOCK_FAIR is removed from it otherwise). SIGINT, SIGTERM,
SIGHUP, SIGQUIT, SIGUSR1 and SIGUSR2 sent to dlock are passed on to that
process group (followed by SIGCONT for the first four, so that a stopped
process gets them). dlock renews the lease every TTL/3 while COMMAND runs,
and exits with COMMAND's exit status.

Kinds of lock (--shared and --semaphore exclude each other):
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
  --fair --shared, --fair --semaphore N
                  a fair reader or permit: NAME's waiters (--fair writers,
                  readers or permits) get it in the order they arrived; a
                  reader waits behind a writer queued before it, even while
                  readers hold NAME. A released permit goes to the head of
                  the queue, a writer's release to the readers queued
                  together at its head. Redis only (one node, Sentinel,
                  Cluster).
Each reader and permit holder has a lease of its own, with its own fence.
The kinds share one name: an exclusive run on NAME excludes its readers and
permit holders too. A store without the kind refuses the flags (exit 64)
before it runs anything: Redlock (redlock://) has no semaphores and no fair
locks, and only Redis has fair readers and permits.

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
queue", and, for a fair reader or permit that the holds alone would let in,
"others are queued ahead"), and again whenever that changes ("now held by"
for a new holder); when stderr is a terminal it also keeps a line showing how
long it has waited. A plain run that waits is also put in the name's queue
after a moment, where the store allows it, so that runs that release and lock
again at once cannot starve it; it shows no place, as it asked for no order.

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
  --fair                     waiters get the lock in arrival order: alone, a
                             fair exclusive lock; with --shared or
                             --semaphore, a fair reader or permit (Redis)
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
          lock (or a lock-delay) the store does not have, up or not
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
  dlock run --fair --semaphore 3 --wait 1h encoders -- ./encode.sh  # Redis
`
