package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync"
	"time"
)

// Kind says what an Event records.
type Kind uint8

// The kinds of event. Lease events are recorded by the workload around the
// public API; store events by Observe around every backend call, renewals
// made in the background included; resource events by the Resource.
const (
	// KindAcquire: Lock, RLock, Acquire or a Try variant returned. Start is
	// when it was called, End when it returned; Deadline is the lease's local
	// validity deadline when it was granted.
	KindAcquire Kind = iota + 1
	// KindRelease: Unlock was called (Start) and returned (End). Deadline is
	// the lease's last local deadline.
	KindRelease
	// KindLoss: the lease ended without Unlock. End is when its holder was
	// told (its context ended; Text "told"), or, when it had not been, when
	// Unlock found the lease gone (Text "found by Unlock"); Deadline is the
	// lease's local deadline then, Err the cause; see ReadTold.
	KindLoss
	// KindRenew: a manual Refresh.
	KindRenew
	// KindStoreAcquire, KindStoreRenew, KindStoreRelease: one backend call
	// (Observe). Token names the owner token on the store.
	KindStoreAcquire
	KindStoreRenew
	KindStoreRelease
	// KindRead and KindWrite: one access to the Resource; Start and End are
	// taken by the resource, so every access sorts on one clock.
	KindRead
	KindWrite
	// KindInit: the Resource's starting value of a name.
	KindInit
	// KindNote: free text from a fault injector ("paused child 1"), shown in
	// the history.
	KindNote
	// KindStoreWithdraw: one backend call that took a waiter's queue
	// entry and writer intent out (driver.Withdrawer), recorded as the
	// other store calls are; Outcome OK or Unknown.
	KindStoreWithdraw
)

var kindNames = [...]string{
	KindAcquire: "acquire", KindRelease: "release", KindLoss: "loss", KindRenew: "renew",
	KindStoreAcquire: "store-acquire", KindStoreRenew: "store-renew", KindStoreRelease: "store-release",
	KindRead: "read", KindWrite: "write", KindInit: "init", KindNote: "note",
	KindStoreWithdraw: "store-withdraw",
}

func (k Kind) String() string {
	if int(k) < len(kindNames) && kindNames[k] != "" {
		return kindNames[k]
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Outcome is what an operation's caller learned.
type Outcome uint8

// The outcomes. Unknown is an operation whose effect on the store cannot be
// known from its answer: a timeout, a cancelled context, a broken connection.
const (
	OK Outcome = iota + 1
	Failed
	Unknown
)

func (o Outcome) String() string {
	switch o {
	case OK:
		return "ok"
	case Failed:
		return "failed"
	case Unknown:
		return "unknown"
	}
	return fmt.Sprintf("outcome(%d)", o)
}

// Mode is the kind of hold a lease is.
type Mode uint8

// The modes: an exclusive lock (Mutex, RWMutex writer), a shared one
// (RWMutex reader) and one permit of a Semaphore of Limit permits.
const (
	Exclusive Mode = iota
	Shared
	Permit
)

func (m Mode) String() string {
	switch m {
	case Exclusive:
		return "exclusive"
	case Shared:
		return "shared"
	case Permit:
		return "permit"
	}
	return fmt.Sprintf("mode(%d)", m)
}

// Event is one recorded operation. Times are Now readings.
type Event struct {
	Kind     Kind    `json:"kind"`
	Client   string  `json:"client,omitempty"` // who acted: "c3", "child-1", "fault"
	Name     string  `json:"name,omitempty"`   // lock (and resource) name; for store events the store key, prefix included
	Lease    string  `json:"lease,omitempty"`  // lease identity, unique in a history
	Token    string  `json:"token,omitempty"`  // owner token (store events)
	Mode     Mode    `json:"mode,omitempty"`
	Limit    int     `json:"limit,omitempty"` // permits (Permit mode)
	Fence    uint64  `json:"fence,omitempty"`
	Start    int64   `json:"start"`
	End      int64   `json:"end"`
	Deadline int64   `json:"deadline,omitempty"` // local validity deadline, on the Now clock
	Outcome  Outcome `json:"outcome,omitempty"`
	Err      string  `json:"err,omitempty"`
	Value    int64   `json:"value,omitempty"`   // resource: stock read or written
	Members  []int64 `json:"members,omitempty"` // resource: set read or written
	Text     string  `json:"text,omitempty"`    // KindNote
	// ReadTold (KindLoss): a read of the lease (Err) after its local
	// deadline said that it was lost, so its holder was told in time
	// however late its context ended (the goroutine that ends it may run
	// late on a loaded machine).
	ReadTold bool `json:"read_told,omitempty"`
}

// Sink takes events. *Recorder is one; RemoteRecorder sends them to one in
// another process.
type Sink interface {
	Add(e Event)
}

// Recorder keeps the events of one run. It is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	events []Event
}

// NewRecorder returns an empty Recorder.
func NewRecorder() *Recorder { return &Recorder{} }

// Add records e.
func (r *Recorder) Add(e Event) {
	r.mu.Lock()
	r.events = append(r.events, e)
	r.mu.Unlock()
}

// Note records a line of free text at the current time, for the history:
// what a fault injector did and when.
func (r *Recorder) Note(format string, args ...any) {
	now := Now()
	r.Add(Event{Kind: KindNote, Client: "fault", Start: now, End: now, Text: fmt.Sprintf(format, args...)})
}

// Events returns a copy of the events, ordered by Start (then End).
func (r *Recorder) Events() []Event {
	r.mu.Lock()
	out := slices.Clone(r.events)
	r.mu.Unlock()
	slices.SortStableFunc(out, func(a, b Event) int {
		if a.Start != b.Start {
			return cmpInt(a.Start, b.Start)
		}
		return cmpInt(a.End, b.End)
	})
	return out
}

// Len returns the number of events recorded so far.
func (r *Recorder) Len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.events)
}

func cmpInt(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Handler serves POST /event (one JSON Event per request) so that child
// processes can record into r through RemoteRecorder.
func (r *Recorder) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			http.Error(w, "POST an event", http.StatusMethodNotAllowed)
			return
		}
		var e Event
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&e); err != nil {
			http.Error(w, "chaos: bad event: "+err.Error(), http.StatusBadRequest)
			return
		}
		r.Add(e)
		w.WriteHeader(http.StatusNoContent)
	})
}

// RemoteRecorder is a Sink that posts events to a Recorder.Handler served at
// URL (for example "http://127.0.0.1:4242/event"). Errors are kept: Err
// returns the first one.
type RemoteRecorder struct {
	URL    string
	Client *http.Client // nil: a client with a 5s timeout

	mu  sync.Mutex
	err error
}

// Add sends e; a failure is kept for Err.
func (r *RemoteRecorder) Add(e Event) {
	body, err := json.Marshal(e)
	if err == nil {
		err = post(context.Background(), r.Client, r.URL, body, nil)
	}
	if err != nil {
		r.mu.Lock()
		if r.err == nil {
			r.err = fmt.Errorf("chaos: record %s event: %w", e.Kind, err)
		}
		r.mu.Unlock()
	}
}

// Err returns the first error Add met, or nil.
func (r *RemoteRecorder) Err() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.err
}

var defaultHTTP = &http.Client{Timeout: 5 * time.Second}

// post sends body and decodes a JSON answer into out (when not nil). An
// answer of 409 Conflict is ErrStale.
func post(ctx context.Context, c *http.Client, url string, body []byte, out any) error {
	if c == nil {
		c = defaultHTTP
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusConflict:
		io.Copy(io.Discard, resp.Body)
		return ErrStale
	case resp.StatusCode >= 300:
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
		return fmt.Errorf("%s: %s", resp.Status, bytes.TrimSpace(msg))
	case out != nil:
		return json.NewDecoder(resp.Body).Decode(out)
	}
	io.Copy(io.Discard, resp.Body)
	return nil
}

// errText is err's message, or "".
func errText(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
