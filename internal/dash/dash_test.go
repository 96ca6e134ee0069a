package dash_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/dash"
	"github.com/dlock-go/dlock/internal/safetext"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/memlock"
	"github.com/dlock-go/dlock/redislock"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeStore hands the sampler the samples a test sets.
type fakeStore struct {
	mu    sync.Mutex
	infos []driver.LockInfo
	err   error
}

func (f *fakeStore) set(infos []driver.LockInfo, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.infos, f.err = infos, err
}

func (f *fakeStore) List(context.Context) ([]driver.LockInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.infos, f.err
}

func get(t *testing.T, h http.Handler, path string) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(http.MethodGet, "http://127.0.0.1:8080"+path, nil)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func state(t *testing.T, h http.Handler) dash.State {
	t.Helper()
	w := get(t, h, "/api/state")
	var st dash.State
	if err := json.Unmarshal(w.Body.Bytes(), &st); err != nil {
		t.Fatalf("/api/state: %v: %s", err, w.Body)
	}
	return st
}

// metric returns the value of a sample line in /metrics.
func metric(t *testing.T, h http.Handler, name string) string {
	t.Helper()
	w := get(t, h, "/metrics")
	if ct := w.Header().Get("Content-Type"); !strings.HasPrefix(ct, "text/plain; version=0.0.4") {
		t.Errorf("/metrics Content-Type %q", ct)
	}
	for line := range strings.SplitSeq(w.Body.String(), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			if !strings.Contains(w.Body.String(), "# TYPE "+name+" ") {
				t.Errorf("/metrics has no TYPE line for %s", name)
			}
			return v
		}
	}
	t.Fatalf("/metrics has no %s:\n%s", name, w.Body)
	return ""
}

// TestSamplerCountsWhatChanged: between two samples, a new hold is a
// grant, a hold gone with time left a release, and one gone when its lease
// could have run out a loss; a failed sample keeps the last good locks and
// sets dlock_dash_up to 0.
func TestSamplerCountsWhatChanged(t *testing.T) {
	f := &fakeStore{}
	d := dash.New(dash.Config{List: f.List, Where: "test", Interval: 250 * time.Millisecond})
	h := d.Handler(false)
	f.set([]driver.LockInfo{{Key: "a", Owner: "o1", Fence: 1, Holds: 1, TTL: 10 * time.Second}}, nil)
	d.Sample(t.Context()) // the baseline: what was held before dash started is no grant
	f.set([]driver.LockInfo{
		{Key: "a", Owner: "o1", Fence: 1, Holds: 1, TTL: 10 * time.Second},
		{Key: "b", Shared: []driver.SharedHold{{Owner: "r1", Fence: 1, TTL: 5 * time.Second}, {Owner: "r2", Fence: 2, TTL: 100 * time.Millisecond}}, Limit: 3, Queued: 2},
	}, nil)
	d.Sample(t.Context())
	st := state(t, h)
	if st.Counts.Grants != 2 || st.Totals != (dash.Totals{Locks: 2, Exclusive: 1, Shared: 2, Queued: 2}) {
		t.Errorf("after two readers came: counts %+v, totals %+v", st.Counts, st.Totals)
	}
	if b := st.Locks[1]; b.Kind != "permits" || b.Holds != 2 || b.Limit != 3 || len(b.Shared) != 2 || b.Queued != 2 {
		t.Errorf("lock b: %+v", b)
	}
	f.set([]driver.LockInfo{
		{Key: "b", Shared: []driver.SharedHold{{Owner: "r1", Fence: 1, TTL: 5 * time.Second}}, Limit: 3},
		{Key: "c", Owner: "o3", Fence: 9, TTL: time.Second, Delayed: true},
	}, nil)
	d.Sample(t.Context())
	st = state(t, h)
	if st.Counts.Grants != 2 || st.Counts.Releases != 1 || st.Counts.Losses != 2 {
		t.Errorf("after a release, an expiry and a lock-delay: %+v, want 2 grants, 1 release, 2 losses", st.Counts)
	}
	if metric(t, h, "dlock_locks_held") != "2" || metric(t, h, "dlock_locks_in_lock_delay") != "1" ||
		metric(t, h, "dlock_dash_losses_total") != "2" || metric(t, h, "dlock_dash_up") != "1" {
		t.Errorf("/metrics:\n%s", get(t, h, "/metrics").Body)
	}
	f.set(nil, errors.New("connection refused"))
	d.Sample(t.Context())
	st = state(t, h)
	if st.Error == "" || len(st.Locks) != 2 || st.Counts.SampleErrors != 1 {
		t.Errorf("after a failed sample: error %q, %d locks, counts %+v", st.Error, len(st.Locks), st.Counts)
	}
	if metric(t, h, "dlock_dash_up") != "0" || metric(t, h, "dlock_dash_sample_errors_total") != "1" {
		t.Error("a failed sample does not show in /metrics")
	}
	var tl []dash.Bucket
	if err := json.Unmarshal(get(t, h, "/api/timeline").Body.Bytes(), &tl); err != nil || len(tl) == 0 {
		t.Fatalf("/api/timeline: %v, %d buckets", err, len(tl))
	}
	var g, r, l int
	for _, b := range tl {
		g, r, l = g+b.Grants, r+b.Releases, l+b.Losses
	}
	if g != 2 || r != 1 || l != 2 {
		t.Errorf("timeline has %d grants, %d releases, %d losses; want 2, 1, 2", g, r, l)
	}
}

// TestStoredStringsEscaped: names and owner strings reach the JSON with
// control and bidi characters escaped, and markup as JSON-escaped text.
func TestStoredStringsEscaped(t *testing.T) {
	const name, owner = "evil\x1b[2J\u202e", "host\x1b]0;pwned\x07|pid 1|<script>alert(1)</script>"
	f := &fakeStore{}
	f.set([]driver.LockInfo{{Key: name, Owner: owner, Fence: 1, Holds: 1, TTL: time.Second}}, nil)
	d := dash.New(dash.Config{List: f.List, Where: "test"})
	d.Sample(t.Context())
	body := get(t, d.Handler(false), "/api/state").Body.String()
	if strings.Contains(body, "<script") || strings.Contains(body, `\u001b`) {
		t.Errorf("/api/state carries markup or a raw escape: %s", body)
	}
	st := state(t, d.Handler(false))
	if st.Locks[0].Name != safetext.Escape(name) || st.Locks[0].Owner != safetext.Escape(owner) {
		t.Errorf("name %q, owner %q: not escaped with safetext.Escape", st.Locks[0].Name, st.Locks[0].Owner)
	}
	for _, s := range []string{st.Locks[0].Name, st.Locks[0].Owner} {
		for _, c := range s {
			if safetext.Unsafe(c) {
				t.Errorf("%q holds %U", s, c)
			}
		}
	}
}

// TestHandlerIsReadOnlyAndLocal: the page and its assets are served with a
// strict content security policy; only GET and HEAD are answered, and only
// for loopback host names unless told otherwise.
func TestHandlerIsReadOnlyAndLocal(t *testing.T) {
	d := dash.New(dash.Config{List: (&fakeStore{}).List, Where: "test"})
	h := d.Handler(false)
	for _, path := range []string{"/", "/app.js", "/style.css"} {
		w := get(t, h, path)
		if w.Code != 200 || !strings.Contains(w.Header().Get("Content-Security-Policy"), "script-src 'self'") {
			t.Errorf("GET %s: %d, CSP %q", path, w.Code, w.Header().Get("Content-Security-Policy"))
		}
	}
	if page := get(t, h, "/").Body.String(); !strings.Contains(page, `<script src="app.js"`) || strings.Contains(page, "http") {
		t.Errorf("the page loads something from elsewhere, or not app.js:\n%s", page)
	}
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodDelete} {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, httptest.NewRequest(method, "http://127.0.0.1/api/state", nil))
		if w.Code != http.StatusMethodNotAllowed {
			t.Errorf("%s: %d, want 405", method, w.Code)
		}
	}
	for host, want := range map[string]int{"localhost:8080": 200, "127.0.0.1": 200, "[::1]:80": 200, "evil.example:8080": 403, "10.0.0.1": 403} {
		for _, anyHost := range []bool{false, true} {
			w := httptest.NewRecorder()
			r := httptest.NewRequest(http.MethodGet, "/metrics", nil)
			r.Host = host
			d.Handler(anyHost).ServeHTTP(w, r)
			if exp := map[bool]int{false: want, true: 200}[anyHost]; w.Code != exp {
				t.Errorf("Host %s, any %v: %d, want %d", host, anyHost, w.Code, exp)
			}
		}
	}
}

func TestCheckListen(t *testing.T) {
	for _, tc := range []struct {
		addr    string
		anyAddr bool
		ok      bool
	}{
		{"127.0.0.1:8080", false, true},
		{"localhost:0", false, true},
		{"[::1]:8080", false, true},
		{":8080", false, false},
		{"0.0.0.0:8080", false, false},
		{"192.0.2.7:8080", false, false},
		{":8080", true, true},
		{"8080", false, false},
	} {
		if err := dash.CheckListen(tc.addr, tc.anyAddr); (err == nil) != tc.ok {
			t.Errorf("CheckListen(%q, %v) = %v", tc.addr, tc.anyAddr, err)
		}
	}
}

// TestRunOnAStore: Run samples a real (in-memory) store until its context
// ends: a lock held through a Client shows with its metadata, and is gone
// after Unlock.
func TestRunOnAStore(t *testing.T) {
	be := memlock.New()
	c := dlock.New(be)
	defer c.Close()
	d := dash.New(dash.Config{List: func(ctx context.Context) ([]driver.LockInfo, error) { return be.List(ctx, "") }, Where: "memlock", Interval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	srv := httptest.NewServer(d.Handler(false))
	defer srv.Close()

	waitFor(t, srv.URL, func(st dash.State) bool { return st.SampledAt != "" }) // the baseline, without the lock
	lease, err := c.Mutex("job", dlock.WithMetadata("<b>cron</b>")).Lock(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, srv.URL, func(st dash.State) bool {
		return len(st.Locks) == 1 && strings.HasSuffix(st.Locks[0].Owner, "|<b>cron</b>")
	})
	if err := lease.Unlock(t.Context()); err != nil {
		t.Fatal(err)
	}
	st := waitFor(t, srv.URL, func(st dash.State) bool { return len(st.Locks) == 0 })
	if st.Counts.Grants != 1 || st.Counts.Releases != 1 {
		t.Errorf("counts %+v, want one grant and one release", st.Counts)
	}
}

// notifyingStore is a store with release notifications and a listing.
type notifyingStore interface {
	driver.Backend
	driver.Notifier
	driver.Inspector
}

// TestRunNotified: on a store that announces releases, the dash shows a
// release at once, not at the next sample: its interval here is an hour,
// so only the notification can make it sample again.
func TestRunNotified(t *testing.T) {
	for _, tc := range []struct {
		name  string
		store func(t *testing.T) notifyingStore
	}{
		{"memlock", func(*testing.T) notifyingStore { return memlock.New() }},
		{"redis", func(t *testing.T) notifyingStore { return redislock.New(testserver.StartRedis(t).Client(t)) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			be := tc.store(t)
			c := dlock.New(be)
			defer c.Close()
			ctx := t.Context()
			held, err := c.Mutex("job").Lock(ctx)
			if err != nil {
				t.Fatal(err)
			}
			d := dash.New(dash.Config{
				List:     func(ctx context.Context) ([]driver.LockInfo, error) { return be.List(ctx, "") },
				Where:    tc.name,
				Interval: time.Hour,
				Notifier: func() driver.Notifier { return be },
			})
			rctx, cancel := context.WithCancel(ctx)
			done := make(chan struct{})
			go func() { defer close(done); d.Run(rctx) }()
			defer func() { cancel(); <-done }()
			srv := httptest.NewServer(d.Handler(false))
			defer srv.Close()

			// The first sample, at once, and the subscription after it.
			waitFor(t, srv.URL, func(st dash.State) bool { return len(st.Locks) == 1 && st.Notifications })
			start := time.Now()
			if err := held.Unlock(ctx); err != nil {
				t.Fatal(err)
			}
			st := waitFor(t, srv.URL, func(st dash.State) bool { return len(st.Locks) == 0 })
			if took := time.Since(start); took > time.Second {
				t.Errorf("the release showed after %v, want under 1s", took)
			}
			if st.Counts.Releases != 1 || st.Counts.Wakeups < 1 || st.Counts.Samples < 2 {
				t.Errorf("counts %+v, want a release seen by a sample woken by its notification", st.Counts)
			}
			if m := metric(t, srv.Config.Handler, "dlock_dash_wakeups_total"); m == "0" {
				t.Errorf("dlock_dash_wakeups_total %s", m)
			}
		})
	}
}

// hungNotifier's subscriptions never complete: a store that hangs.
type hungNotifier struct{ subscribing chan string }

func (n *hungNotifier) Listen(context.Context, func(key, next string)) (driver.Listener, error) {
	return n, nil
}

func (n *hungNotifier) Subscribe(ctx context.Context, key string) error {
	select {
	case n.subscribing <- key:
	default:
	}
	<-ctx.Done()
	return ctx.Err()
}

func (n *hungNotifier) Unsubscribe(context.Context, string) error { return nil }
func (n *hungNotifier) Close() error                              { return nil }

// TestRunNotifierHung: subscriptions that hang do not hold up the
// samples, and notifications are not reported on while none is made.
func TestRunNotifierHung(t *testing.T) {
	store := &fakeStore{}
	store.set([]driver.LockInfo{{Key: "job", Owner: "a", Fence: 1, Holds: 1, TTL: time.Minute}}, nil)
	n := &hungNotifier{subscribing: make(chan string, 1)}
	d := dash.New(dash.Config{List: store.List, Where: "test", Interval: 20 * time.Millisecond,
		Notifier: func() driver.Notifier { return n }})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); d.Run(ctx) }()
	defer func() { cancel(); <-done }()
	select {
	case <-n.subscribing:
	case <-time.After(5 * time.Second):
		t.Fatal("no subscription was tried")
	}
	start, _ := d.Snapshot()
	time.Sleep(300 * time.Millisecond) // within the subscription's 2s
	st, _ := d.Snapshot()
	if st.Counts.Samples < start.Counts.Samples+5 {
		t.Errorf("%d samples in 300ms at 20ms while a subscription hung, want at least 5", st.Counts.Samples-start.Counts.Samples)
	}
	if st.Notifications {
		t.Error("notifications reported on while no subscription was made")
	}
}

func waitFor(t *testing.T, url string, ok func(dash.State) bool) dash.State {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	var st dash.State
	for time.Now().Before(deadline) {
		resp, err := http.Get(url + "/api/state")
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		st = dash.State{}
		if err := json.Unmarshal(b, &st); err != nil {
			t.Fatal(err)
		}
		if ok(st) {
			return st
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("state never as wanted; last %+v", st)
	return st
}

// postRelease sends POST /api/release to h for host, with auth in its
// Authorization header (none when "").
func postRelease(h http.Handler, host, auth, body string) *httptest.ResponseRecorder {
	w := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "/api/release", strings.NewReader(body))
	r.Host = host
	if auth != "" {
		r.Header.Set("Authorization", auth)
	}
	h.ServeHTTP(w, r)
	return w
}

// releaseBody is a release request's JSON body for key and fence (a JSON
// string, as the page sends it).
func releaseBody(key string, fence uint64) string {
	return fmt.Sprintf(`{"key_hex":%q,"fence":"%d"}`, hex.EncodeToString([]byte(key)), fence)
}

// TestForceRelease: the release endpoint exists only with Config.Release,
// wants the token in an Authorization header and a JSON body naming the
// key and the fence of the grant, answers only loopback hosts, and calls
// Release with the raw key and the fence.
func TestForceRelease(t *testing.T) {
	post := postRelease
	// Read-only: no release, whatever the request carries.
	ro := dash.New(dash.Config{List: (&fakeStore{}).List, Where: "test"})
	if w := post(ro.Handler(false), "127.0.0.1", "Bearer x", `{"key_hex":"61","fence":"1"}`); w.Code != http.StatusMethodNotAllowed {
		t.Errorf("read-only dash: %d, want 405", w.Code)
	}
	if st, _ := ro.Snapshot(); st.Release {
		t.Error("a read-only dash offers the button")
	}

	type call struct {
		key   string
		fence uint64
	}
	var released []call
	d := dash.New(dash.Config{List: (&fakeStore{}).List, Where: "test", ReleaseToken: "s3cret",
		Release: func(_ context.Context, key string, fence uint64) (bool, error) {
			released = append(released, call{key, fence})
			return true, nil
		}})
	if st, _ := d.Snapshot(); !st.Release {
		t.Error("the button is not offered")
	}
	h := d.Handler(false)
	for _, tc := range []struct {
		host, auth, body string
		want             int
	}{
		{"127.0.0.1", "", `{"key_hex":"61","fence":"7"}`, http.StatusForbidden},
		{"127.0.0.1", "Bearer wrong", `{"key_hex":"61","fence":"7"}`, http.StatusForbidden},
		{"127.0.0.1", "s3cret", `{"key_hex":"61","fence":"7"}`, http.StatusForbidden},
		{"evil.example", "Bearer s3cret", `{"key_hex":"61","fence":"7"}`, http.StatusForbidden},
		{"127.0.0.1", "Bearer s3cret", `not json`, http.StatusBadRequest},
		{"127.0.0.1", "Bearer s3cret", `{"key_hex":"","fence":"7"}`, http.StatusBadRequest},
		// The fence of the grant shown is required: without it the
		// button would break whoever holds the lock now.
		{"127.0.0.1", "Bearer s3cret", `{"key_hex":"61"}`, http.StatusBadRequest},
		{"127.0.0.1", "Bearer s3cret", `{"key_hex":"61","fence":""}`, http.StatusBadRequest},
		{"127.0.0.1", "Bearer s3cret", `{"key_hex":"61","fence":"0"}`, http.StatusBadRequest},
		{"127.0.0.1", "Bearer s3cret", `{"key_hex":"61","fence":0}`, http.StatusBadRequest},
		{"127.0.0.1", "Bearer s3cret", `{"key_hex":"61","fence":"-7"}`, http.StatusBadRequest},
		{"127.0.0.1", "Bearer s3cret", `{"key_hex":"61","fence":"7.0"}`, http.StatusBadRequest},
		{"127.0.0.1", "Bearer s3cret", `{"key_hex":"61","fence":7e0}`, http.StatusBadRequest},
		{"127.0.0.1", "Bearer s3cret", `{"key_hex":"61","fence":"seven"}`, http.StatusBadRequest},
		{"127.0.0.1", "Bearer s3cret", `{"key_hex":"61","fence":"18446744073709551616"}`, http.StatusBadRequest},
		{"127.0.0.1", "Bearer s3cret", `{"key_hex":"61","fence":true}`, http.StatusBadRequest},
	} {
		if w := post(h, tc.host, tc.auth, tc.body); w.Code != tc.want {
			t.Errorf("%+v: %d, want %d", tc, w.Code, tc.want)
		}
	}
	if len(released) != 0 {
		t.Fatalf("refused requests released %q", released)
	}
	w := post(h, "localhost:8080", "Bearer s3cret", releaseBody("jobs/<b>\x1b", 18446744073709551615))
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"released":true`) {
		t.Fatalf("release: %d %s", w.Code, w.Body.String())
	}
	// A JSON number is taken too, exactly.
	if w := post(h, "localhost:8080", "Bearer s3cret", `{"key_hex":"61","fence":9007199254740993}`); w.Code != 200 {
		t.Fatalf("release with a JSON number: %d %s", w.Code, w.Body.String())
	}
	want := []call{{"jobs/<b>\x1b", 18446744073709551615}, {"a", 9007199254740993}}
	if !slices.Equal(released, want) {
		t.Errorf("released %+v, want %+v (the raw key, the exact fence)", released, want)
	}
	// Other paths stay read-only.
	wr := httptest.NewRecorder()
	r := httptest.NewRequest(http.MethodPost, "http://127.0.0.1/api/state", nil)
	r.Header.Set("Authorization", "Bearer s3cret")
	h.ServeHTTP(wr, r)
	if wr.Code != http.StatusMethodNotAllowed {
		t.Errorf("POST /api/state with the token: %d, want 405", wr.Code)
	}
}

// breakerStore is a store that can break a grant by its fence.
type breakerStore interface {
	driver.Backend
	driver.Inspector
	driver.Breaker
}

// TestForceReleaseOfTheGrantShown: on a store (memlock), the button breaks
// the grant whose fence the page showed; a lock that changed hands since
// keeps its new holder (409, "changed hands"), as does a grant with a
// lock-delay and a lock with shared holds only; a lock released since is
// answered released false; the token is still needed.
func TestForceReleaseOfTheGrantShown(t *testing.T) {
	var be breakerStore = memlock.New()
	c := dlock.New(be)
	defer c.Close()
	ctx := t.Context()
	d := dash.New(dash.Config{List: func(ctx context.Context) ([]driver.LockInfo, error) { return be.List(ctx, "") },
		Where: "memlock", ReleaseToken: "s3cret", Release: be.BreakIf, Inspect: be.Inspect})
	h := d.Handler(false)
	post := func(body string) *httptest.ResponseRecorder {
		return postRelease(h, "127.0.0.1", "Bearer s3cret", body)
	}
	heldBy := func(name string, fence uint64) {
		t.Helper()
		info, ok, err := be.Inspect(ctx, name)
		if err != nil || !ok || info.Fence != fence {
			t.Fatalf("%s: held %v by fence %d (%v), want held by fence %d", name, ok, info.Fence, err, fence)
		}
	}
	mustLive := func(l *dlock.Lease) {
		t.Helper()
		select {
		case <-l.Done():
			t.Fatalf("the holder of fence %d lost its lock: %v", l.Fence(), l.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}

	// The grant shown is broken, and its holder learns of it.
	first, err := c.Mutex("job", dlock.WithTTL(time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	d.Sample(ctx)
	st, _ := d.Snapshot()
	if len(st.Locks) != 1 || st.Locks[0].FenceDec != fmt.Sprint(first.Fence()) {
		t.Fatalf("the page's lock %+v, want fence_dec %d", st.Locks, first.Fence())
	}
	// Not without the token.
	if w := postRelease(h, "127.0.0.1", "Bearer wrong", releaseBody("job", first.Fence())); w.Code != http.StatusForbidden {
		t.Errorf("with a wrong token: %d %s, want 403", w.Code, w.Body)
	}
	if w := postRelease(h, "127.0.0.1", "", releaseBody("job", first.Fence())); w.Code != http.StatusForbidden {
		t.Errorf("without the token: %d %s, want 403", w.Code, w.Body)
	}
	// Nor without the fence.
	if w := post(`{"key_hex":"` + hex.EncodeToString([]byte("job")) + `"}`); w.Code != http.StatusBadRequest {
		t.Errorf("without a fence: %d %s, want 400", w.Code, w.Body)
	}
	heldBy("job", first.Fence())
	w := post(releaseBody("job", first.Fence()))
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"released":true`) {
		t.Fatalf("release of the grant shown: %d %s", w.Code, w.Body)
	}
	if _, ok, _ := be.Inspect(ctx, "job"); ok {
		t.Error("the lock is still held after the release of its grant")
	}
	select {
	case <-first.Done():
	case <-time.After(3 * time.Second):
		t.Error("the broken holder did not learn of it within 3s")
	}

	// The lock changed hands since the page showed fence first: its new
	// holder keeps it.
	second, err := c.Mutex("job", dlock.WithTTL(time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = second.Unlock(context.WithoutCancel(ctx)) }()
	w = post(releaseBody("job", first.Fence()))
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "changed hands") {
		t.Errorf("release of a grant gone, the lock held by another: %d %s, want 409 changed hands", w.Code, w.Body)
	}
	heldBy("job", second.Fence())
	mustLive(second)

	// A lock released since the page showed it: nothing to break.
	if err := second.Unlock(ctx); err != nil {
		t.Fatal(err)
	}
	w = post(releaseBody("job", second.Fence()))
	if w.Code != 200 || !strings.Contains(w.Body.String(), `"released":false`) {
		t.Errorf("release of a lock nobody holds: %d %s, want 200 released false", w.Code, w.Body)
	}

	// A grant with a lock-delay is never broken by the button: the
	// answer says why.
	delayed, err := c.Mutex("delayed", dlock.WithTTL(time.Second), dlock.WithLockDelay(time.Second)).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = delayed.Unlock(context.WithoutCancel(ctx)) }()
	w = post(releaseBody("delayed", delayed.Fence()))
	if w.Code != http.StatusConflict || !strings.Contains(w.Body.String(), "lock-delay") {
		t.Errorf("release of a grant with a lock-delay: %d %s, want 409 naming the lock-delay", w.Code, w.Body)
	}
	heldBy("delayed", delayed.Fence())
	mustLive(delayed)

	// Shared holds have no single grant: a reader's fence breaks nothing.
	reader, err := c.RWMutex("shared", dlock.WithTTL(time.Second)).RLock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = reader.Unlock(context.WithoutCancel(ctx)) }()
	w = post(releaseBody("shared", reader.Fence()))
	if w.Code != http.StatusConflict {
		t.Errorf("release of a reader's fence: %d %s, want 409", w.Code, w.Body)
	}
	if info, ok, err := be.Inspect(ctx, "shared"); err != nil || !ok || len(info.Shared) != 1 {
		t.Errorf("the reader's lock after the refused release: %+v, %v, %v", info, ok, err)
	}
	mustLive(reader)
	d.Sample(ctx)
	st, _ = d.Snapshot()
	for _, l := range st.Locks {
		if l.Kind == "readers" && l.FenceDec != "" {
			t.Errorf("the page offers fence %s of a lock with shared holds only", l.FenceDec)
		}
	}
}

// TestForceReleaseWithoutBreaker: a store that cannot break a lock on
// condition of its grant gets 501 with Release's message, never a blind
// release.
func TestForceReleaseWithoutBreaker(t *testing.T) {
	d := dash.New(dash.Config{List: (&fakeStore{}).List, Where: "test", ReleaseToken: "s3cret",
		Release: func(context.Context, string, uint64) (bool, error) {
			return false, fmt.Errorf("Redlock: %w", dash.ErrNoBreaker)
		}})
	w := postRelease(d.Handler(false), "127.0.0.1", "Bearer s3cret", releaseBody("job", 3))
	if w.Code != http.StatusNotImplemented || !strings.Contains(w.Body.String(), "no BreakIf") {
		t.Errorf("release on a store without BreakIf: %d %s, want 501", w.Code, w.Body)
	}
}
