package chaostest

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/locktest/chaos"
)

// childEnv is the environment variable that turns the test binary into a
// child process: it holds the JSON childSpec the child runs.
const childEnv = "DLOCK_CHAOS_CHILD"

// childLine starts every line a child writes on its standard output for the
// parent to read; everything else (the race detector's reports, panics) goes
// to standard error.
const childLine = "chaos-child:"

// The roles of a child process.
const (
	// rolePause: each "step" command runs one critical section that stops
	// before its write: the child says "paused fence=N held=B" and reads a
	// line from its standard input (the parent SIGSTOPs it meanwhile, and
	// writes the line just before its SIGCONT, so that a child resumed by
	// anything else cannot write), then writes whatever its lease says, as
	// code that checked its lock just before a long pause would, unlocks
	// and says "done ...".
	rolePause = "pause"
	// roleCrash: the "step" command takes the lock, reads, says "holding
	// fence=N" and waits for a line that never comes: the parent kills it.
	roleCrash = "crash"
	// roleHead: the "step" command runs one critical section while another
	// client holds the lock, with a Fair Mutex or a plain one (whose wait
	// starves and queues): the child waits at the head of the fair queue, where the parent stops it (SIGSTOP), releases
	// the lock (on Redis the release grants it to the stopped head) and
	// kills it (SIGKILL) before it could hear of its grant. Should it get
	// the lock all the same, it says "holding fence=N" and waits for the
	// kill, as roleCrash does.
	roleHead = "head"
)

// childSpec is what a child process does, JSON-encoded in childEnv.
type childSpec struct {
	ID       int            `json:"id"` // the child's client is "child-<ID>"
	Role     string         `json:"role"`
	Store    storeSpec      `json:"store"`
	Name     string         `json:"name"` // the lock (and resource) name
	TTL      time.Duration  `json:"ttl"`
	Workload chaos.Workload `json:"workload"`
	Think    time.Duration  `json:"think"`    // the Worker's Think: the pause comes up to this long after the read
	Fair     bool           `json:"fair"`     // lock with a Fair Mutex
	Recorder string         `json:"recorder"` // URL of the parent's Recorder.Handler
	Resource string         `json:"resource"` // base URL of the parent's Resource.Handler
}

// client is the child's name in the events.
func (s childSpec) client() string { return fmt.Sprintf("child-%d", s.ID) }

// childWorkerID is added to a child's ID to make its Worker ID, so that the
// set members it adds never collide with the in-process workers'.
const childWorkerID = 1000

// childStepTimeout bounds one step of a child, so that a child whose parent
// forgot it still ends.
const childStepTimeout = 2 * time.Minute

// childMain runs the child process when childEnv is set: TestMain calls it
// first and exits with code when isChild. A child reads commands from its
// standard input, one a line ("step", "exit"), and answers on its standard
// output with lines that start with childLine.
func childMain() (isChild bool, code int) {
	raw, ok := os.LookupEnv(childEnv)
	if !ok {
		return false, 0
	}
	var spec childSpec
	if err := json.Unmarshal([]byte(raw), &spec); err != nil {
		fmt.Fprintf(os.Stderr, "chaos child: bad %s: %v\n", childEnv, err)
		return true, 2
	}
	if err := runChild(spec, os.Stdin, os.Stdout); err != nil {
		fmt.Fprintf(os.Stderr, "chaos child %d: %v\n", spec.ID, err)
		return true, 1
	}
	return true, 0
}

// runChild opens the store, makes a client whose store calls and lease
// events are recorded in the parent, and obeys the commands read from in.
func runChild(spec childSpec, in io.Reader, out io.Writer) (err error) {
	if spec.Role != rolePause && spec.Role != roleCrash && spec.Role != roleHead {
		return fmt.Errorf("unknown role %q", spec.Role)
	}
	backend, closeStore, err := spec.Store.open()
	if err != nil {
		return fmt.Errorf("open %s store: %w", spec.Store.Kind, err)
	}
	rec := &chaos.RemoteRecorder{URL: spec.Recorder}
	locks := dlock.New(chaos.Observe(backend, rec, spec.client()), dlock.WithTTL(spec.TTL))
	defer func() {
		err = errors.Join(err, locks.Close(), closeStore(), rec.Err())
	}()

	lines := bufio.NewReader(in)
	say := func(format string, args ...any) {
		fmt.Fprintf(out, childLine+" "+format+"\n", args...)
	}
	w := &chaos.Worker{
		ID:       childWorkerID + spec.ID,
		Client:   spec.client(),
		Locks:    locks,
		Resource: chaos.RemoteResource{URL: spec.Resource},
		Sink:     rec,
		Workload: spec.Workload,
		Think:    spec.Think,
		// A paused holder checked its lease before the pause (below) and
		// cannot check it again before writing: the write follows the
		// pause at once.
		IgnoreLoss: true,
		Options:    []dlock.Option{dlock.WithTTL(spec.TTL)},
	}
	if spec.Fair {
		w.Options = append(w.Options, dlock.Fair())
	}
	var hookErr error
	w.BeforeWrite = func(ctx context.Context, l *dlock.Lease) {
		switch spec.Role {
		case rolePause:
			say("paused fence=%d held=%t", l.Fence(), l.Err() == nil)
			if _, err := lines.ReadString('\n'); err != nil {
				hookErr = fmt.Errorf("wait to resume: %w", err)
			}
		case roleCrash, roleHead:
			say("holding fence=%d", l.Fence())
			// The parent kills the child here. Should its line come
			// (or its end, the parent gone), leave without writing.
			_, err := lines.ReadString('\n')
			fmt.Fprintf(os.Stderr, "chaos child %d: not killed while holding (stdin: %v)\n", spec.ID, err)
			os.Exit(3)
		}
	}
	say("ready")
	for {
		cmd, err := lines.ReadString('\n')
		if err != nil {
			return fmt.Errorf("read command: %w", err)
		}
		switch strings.TrimSpace(cmd) {
		case "exit":
			say("bye")
			return nil
		case "step":
			ctx, cancel := context.WithTimeout(context.Background(), childStepTimeout)
			res, err := w.Step(ctx, chaos.Target{Name: spec.Name, Mode: chaos.Exclusive})
			cancel()
			if err != nil {
				return fmt.Errorf("lock %q: %w", spec.Name, err)
			}
			if hookErr != nil {
				return hookErr
			}
			say("done lease=%s fence=%d wrote=%t stale=%t lost=%t", res.Lease, res.Fence, res.Wrote, res.Stale, res.Lost)
		default:
			return fmt.Errorf("unknown command %q", strings.TrimSpace(cmd))
		}
	}
}
