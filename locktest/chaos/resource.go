package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"slices"
	"strings"
	"sync"
)

// ErrStale is the answer of a fenced Resource to an access whose fence is
// lower than one it has already accepted for that name.
var ErrStale = errors.New("chaos: stale fence rejected")

// Access identifies who reads or writes the resource, under which lease.
type Access struct {
	Client string `json:"client"`
	Name   string `json:"name"`
	Lease  string `json:"lease"`
	Fence  uint64 `json:"fence"`
	// Mode is the lease's: a Shared (reader's) access is refused only when
	// a writer has come in with a higher fence, as readers of one grant
	// period may reach the resource in any order.
	Mode Mode `json:"mode,omitempty"`
}

// Value is the content of one name of the resource: a stock count (the
// stock workload) and a set of members (the set workload).
type Value struct {
	Stock   int64   `json:"stock"`
	Members []int64 `json:"members,omitempty"`
}

// Accessor reads and writes the protected resource. *Resource is one;
// RemoteResource reaches one in another process.
type Accessor interface {
	Read(ctx context.Context, a Access) (Value, error)
	Write(ctx context.Context, a Access, v Value) error
}

// Resource is what the locks protect in a chaos run: a register per lock
// name that holds a Value, kept in the memory of the test process and
// reached by every client, as a database would be. It stamps every access
// on its own clock and records it, so that the order it saw is the order the
// checker sees.
//
// A fenced Resource keeps the highest fence it has accepted per name and
// refuses (ErrStale) a read or a write with a lower one: a new holder's
// first read shuts every older holder out, which is what makes a
// read-sleep-write critical section safe when its lease has lapsed. Readers
// (Access.Mode Shared) shut writers out the same way, but among themselves
// they may come in any order: a reader is refused only a fence below the
// highest fence of an exclusive access. An unfenced Resource accepts
// everything, as most resources do.
type Resource struct {
	fenced bool
	sink   Sink

	mu   sync.Mutex
	regs map[string]*register
}

type register struct {
	value     Value
	fence     uint64 // highest fence accepted
	exclusive uint64 // highest fence of an exclusive access accepted
}

var _ Accessor = (*Resource)(nil)

// NewResource returns an empty resource that records its accesses in sink.
func NewResource(sink Sink, fenced bool) *Resource {
	return &Resource{fenced: fenced, sink: sink, regs: make(map[string]*register)}
}

// Fenced reports whether the resource checks fences.
func (r *Resource) Fenced() bool { return r.fenced }

// Init sets the starting value of name and records it.
func (r *Resource) Init(name string, v Value) {
	now := Now()
	v.Members = slices.Clone(v.Members)
	r.mu.Lock()
	r.regs[name] = &register{value: v}
	r.mu.Unlock()
	r.sink.Add(Event{Kind: KindInit, Client: "resource", Name: name, Start: now, End: now, Outcome: OK, Value: v.Stock, Members: v.Members})
}

// Snapshot returns the current value of name.
func (r *Resource) Snapshot(name string) Value {
	r.mu.Lock()
	defer r.mu.Unlock()
	reg := r.reg(name)
	return Value{Stock: reg.value.Stock, Members: slices.Clone(reg.value.Members)}
}

// Names returns the names the resource has seen, sorted.
func (r *Resource) Names() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	names := make([]string, 0, len(r.regs))
	for n := range r.regs {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

func (r *Resource) reg(name string) *register {
	reg := r.regs[name]
	if reg == nil {
		reg = &register{}
		r.regs[name] = reg
	}
	return reg
}

// admit applies the fence rule under r.mu.
func (r *Resource) admit(reg *register, a Access) bool {
	if a.Mode == Shared {
		if r.fenced && a.Fence < reg.exclusive {
			return false
		}
	} else {
		if r.fenced && a.Fence < reg.fence {
			return false
		}
		reg.exclusive = max(reg.exclusive, a.Fence)
	}
	reg.fence = max(reg.fence, a.Fence)
	return true
}

// Read returns the value of a.Name, or ErrStale.
func (r *Resource) Read(ctx context.Context, a Access) (Value, error) {
	if err := ctx.Err(); err != nil {
		return Value{}, err
	}
	r.mu.Lock()
	start := Now()
	reg := r.reg(a.Name)
	ok := r.admit(reg, a)
	v := Value{Stock: reg.value.Stock, Members: slices.Clone(reg.value.Members)}
	end := Now()
	r.mu.Unlock()
	e := Event{Kind: KindRead, Client: a.Client, Name: a.Name, Lease: a.Lease, Fence: a.Fence, Mode: a.Mode, Start: start, End: end, Outcome: OK, Value: v.Stock, Members: v.Members}
	if !ok {
		e.Outcome, e.Err, e.Value, e.Members = Failed, ErrStale.Error(), 0, nil
		r.sink.Add(e)
		return Value{}, ErrStale
	}
	r.sink.Add(e)
	return v, nil
}

// Write replaces the value of a.Name with v, or returns ErrStale.
func (r *Resource) Write(ctx context.Context, a Access, v Value) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	v.Members = slices.Clone(v.Members)
	r.mu.Lock()
	start := Now()
	reg := r.reg(a.Name)
	ok := r.admit(reg, a)
	if ok {
		reg.value = v
	}
	end := Now()
	r.mu.Unlock()
	e := Event{Kind: KindWrite, Client: a.Client, Name: a.Name, Lease: a.Lease, Fence: a.Fence, Mode: a.Mode, Start: start, End: end, Outcome: OK, Value: v.Stock, Members: v.Members}
	if !ok {
		e.Outcome, e.Err = Failed, ErrStale.Error()
		r.sink.Add(e)
		return ErrStale
	}
	r.sink.Add(e)
	return nil
}

type accessRequest struct {
	Access Access `json:"access"`
	Value  Value  `json:"value"`
}

// Handler serves the resource to other processes: POST /read and POST
// /write with a JSON body {"access": Access, "value": Value}; a stale fence
// is answered 409 Conflict. Use it with RemoteResource.
func (r *Resource) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost {
			http.Error(w, "POST /read or /write", http.StatusMethodNotAllowed)
			return
		}
		var ar accessRequest
		if err := json.NewDecoder(io.LimitReader(req.Body, 1<<20)).Decode(&ar); err != nil {
			http.Error(w, "chaos: bad access: "+err.Error(), http.StatusBadRequest)
			return
		}
		var (
			v   Value
			err error
		)
		switch {
		case strings.HasSuffix(req.URL.Path, "/read"):
			v, err = r.Read(req.Context(), ar.Access)
		case strings.HasSuffix(req.URL.Path, "/write"):
			err = r.Write(req.Context(), ar.Access, ar.Value)
		default:
			http.NotFound(w, req)
			return
		}
		switch {
		case errors.Is(err, ErrStale):
			http.Error(w, err.Error(), http.StatusConflict)
		case err != nil:
			http.Error(w, err.Error(), http.StatusServiceUnavailable)
		default:
			w.Header().Set("Content-Type", "application/json")
			json.NewEncoder(w).Encode(v)
		}
	})
}

// RemoteResource is an Accessor for a Resource.Handler served at URL (for
// example "http://127.0.0.1:4242/resource", without /read or /write).
type RemoteResource struct {
	URL    string
	Client *http.Client // nil: a client with a 5s timeout
}

var _ Accessor = RemoteResource{}

// Read returns the value of a.Name, or ErrStale.
func (r RemoteResource) Read(ctx context.Context, a Access) (Value, error) {
	body, err := json.Marshal(accessRequest{Access: a})
	if err != nil {
		return Value{}, err
	}
	var v Value
	err = post(ctx, r.Client, strings.TrimSuffix(r.URL, "/")+"/read", body, &v)
	return v, err
}

// Write replaces the value of a.Name with v, or returns ErrStale.
func (r RemoteResource) Write(ctx context.Context, a Access, v Value) error {
	body, err := json.Marshal(accessRequest{Access: a, Value: v})
	if err != nil {
		return err
	}
	return post(ctx, r.Client, strings.TrimSuffix(r.URL, "/")+"/write", body, nil)
}
