package main

import (
	"cmp"
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// A partitioned sweeper's client logs every failed dial.
	redis.SetLogger(&logging.VoidLogger{})
	goleak.VerifyTestMain(m,
		// A go-redis pool that failed to dial keeps one goroutine that dials
		// again every second; Close ends it when it wakes.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
		// toxiproxy's links end a moment after their proxy is removed.
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).Start.func1"),
	)
}

// Timings of the test: short, but with room for the race detector.
const (
	deviceTTL     = 600 * time.Millisecond
	beatEvery     = 150 * time.Millisecond
	sweepInterval = 100 * time.Millisecond
	lockTTL       = time.Second
	// slack is what a check allows beyond the exact bound for scheduling
	// and round trips.
	slack = 250 * time.Millisecond
)

// device sends heartbeats until stopped, and remembers when the last one
// was answered.
type device struct {
	id     string
	cancel context.CancelFunc
	done   chan struct{}

	mu       sync.Mutex
	lastBeat time.Time // when the last heartbeat's reply arrived
}

func startDevice(t *testing.T, st *store, id string) *device {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &device{id: id, cancel: cancel, done: make(chan struct{})}
	if _, err := st.heartbeat(ctx, id); err != nil {
		t.Fatalf("first heartbeat of %s: %v", id, err)
	}
	d.lastBeat = time.Now()
	go func() {
		defer close(d.done)
		tick := time.NewTicker(beatEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if _, err := st.heartbeat(ctx, id); err == nil {
				d.mu.Lock()
				d.lastBeat = time.Now()
				d.mu.Unlock()
			}
		}
	}()
	t.Cleanup(d.stop)
	return d
}

// stop stops the heartbeats and returns the time of the last answered one.
func (d *device) stop() {
	d.cancel()
	<-d.done
}

// stopped reports whether the device's heartbeats were stopped.
func (d *device) stopped() bool {
	select {
	case <-d.done:
		return true
	default:
		return false
	}
}

func (d *device) last() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.lastBeat
}

// instance is one service instance's sweeper, with its own connection to
// Redis (through a proxy that can cut it off) and its own dlock Client.
type instance struct {
	name   string
	sw     *sweeper
	proxy  *testserver.Proxy
	cancel context.CancelFunc
	done   chan struct{}
}

func startInstance(t *testing.T, srv *testserver.Redis, fleet, name string) *instance {
	t.Helper()
	px := testserver.StartProxy(t, srv.Addr())
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr(), ContextTimeoutEnabled: true,
		MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	locks := dlock.New(redislock.New(rdb))
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		log = slog.New(slog.NewTextHandler(testWriter{t, name}, nil))
	}
	in := &instance{
		name:  name,
		proxy: px,
		sw: &sweeper{store: &store{rdb: rdb, fleet: fleet, ttl: deviceTTL}, locks: locks,
			lockTTL: lockTTL, interval: sweepInterval, log: log},
		done: make(chan struct{}),
	}
	ctx, cancel := context.WithCancel(context.Background())
	in.cancel = cancel
	go func() {
		defer close(in.done)
		_ = in.sw.run(ctx)
	}()
	t.Cleanup(func() {
		in.stop()
		_ = locks.Close()
		_ = rdb.Close()
	})
	return in
}

// stopped reports whether the instance was stopped.
func (in *instance) stopped() bool {
	select {
	case <-in.done:
		return true
	default:
		return false
	}
}

// stop cancels the instance's sweeper and waits for it.
func (in *instance) stop() {
	in.cancel()
	<-in.done
}

type testWriter struct {
	t    *testing.T
	name string
}

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Logf("%s: %s", w.name, p)
	return len(p), nil
}

// waitLeader waits until one of the instances other than not leads, and
// returns it.
func waitLeader(t *testing.T, within time.Duration, ins []*instance, not ...*instance) *instance {
	t.Helper()
	deadline := time.Now().Add(within)
	for time.Now().Before(deadline) {
		for _, in := range ins {
			if in.sw.leading.Load() != 0 && !slices.Contains(not, in) {
				return in
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no new sweeper elected within %v", within)
	return nil
}

// stopAndWatch stops the devices and checks that each leaves the online
// list within its TTL of its last heartbeat, and that its "offline" event
// is published within TTL plus a sweep interval.
func stopAndWatch(t *testing.T, st *store, devs []*device) {
	t.Helper()
	ctx := t.Context()
	last := map[string]time.Time{}
	for _, d := range devs {
		d.stop()
		last[d.id] = d.last()
	}
	gone := map[string]time.Duration{}
	deadline := time.Now().Add(deviceTTL + 2*slack)
	for len(gone) < len(devs) && time.Now().Before(deadline) {
		online, err := st.online(ctx)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range devs {
			if _, ok := gone[d.id]; !ok && !slices.Contains(online, d.id) {
				gone[d.id] = time.Since(last[d.id])
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, d := range devs {
		after, ok := gone[d.id]
		if !ok || after > deviceTTL+slack {
			t.Errorf("%s still listed online %v after its last heartbeat (TTL %v)", d.id, time.Since(last[d.id]), deviceTTL)
		}
	}
	waitOffline(t, st, devs, deviceTTL+sweepInterval+lockTTL+slack)
}

// waitOffline waits until every device has an "offline" event.
func waitOffline(t *testing.T, st *store, devs []*device, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		evs, err := st.events(t.Context(), "0", 0, 0)
		if err != nil {
			t.Fatal(err)
		}
		missing := 0
		for _, d := range devs {
			if !slices.ContainsFunc(evs, func(e event) bool { return e.Device == d.id && e.Kind == eventOffline }) {
				missing++
			}
		}
		if missing == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d stopped devices have no offline event after %v", missing, len(devs), within)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

var long = flag.Bool("presence.long", false,
	"run the long version: 100 devices and 12 changes of sweeper (default: 12 devices, 2 changes)")

// TestPresence runs devices and three sweeper instances against a real
// Redis, in rounds. In each round after the first the leading sweeper is
// taken away — cancelled (it unlocks, and a fresh instance takes its place)
// or cut off from Redis mid-run, as a crash or a partition would (no
// release, no renewal; its lease runs out, and it rejoins when the network
// heals) — and a group of devices stops; the devices stopped two rounds
// before come back. Every stopped device must leave the online list within
// its TTL and get exactly one "offline" event; running devices none; events
// alternate online/offline per device; the offline events' fences never go
// down; the sweepers' terms never overlap.
func TestPresence(t *testing.T) {
	devices, rounds, group := 12, 3, 4
	if *long {
		devices, rounds, group = 100, 13, 7
	}
	srv := testserver.StartRedis(t)
	rdb := srv.Client(t)
	fleet := "test"
	st := &store{rdb: rdb, fleet: fleet, ttl: deviceTTL}

	devs := make([]*device, devices)
	for i := range devs {
		devs[i] = startDevice(t, st, fmt.Sprintf("dev-%03d", i))
	}
	var ins []*instance // every instance started, alive or not
	for range 3 {
		ins = append(ins, startInstance(t, srv, fleet, fmt.Sprintf("sweeper-%d", len(ins))))
	}
	alive := func() []*instance {
		var out []*instance
		for _, in := range ins {
			if !in.stopped() {
				out = append(out, in)
			}
		}
		return out
	}

	leader := waitLeader(t, 2*time.Second, ins)
	t.Logf("round 0: %s leads (fence %d)", leader.name, leader.sw.leading.Load())
	wantOffline := map[string]int{}
	for r := range rounds {
		var healAfter *instance
		if r > 0 {
			old := leader
			if r%2 == 1 {
				// Cancelled mid-run: it unlocks, and another is elected at
				// once (woken by the release). A fresh instance keeps three.
				old.stop()
				ins = append(ins, startInstance(t, srv, fleet, fmt.Sprintf("sweeper-%d", len(ins))))
				leader = waitLeader(t, time.Second, alive(), old)
			} else {
				// Cut off: the next is elected when the lease runs out.
				old.proxy.Partition(t)
				leader = waitLeader(t, lockTTL+time.Second, alive(), old)
				healAfter = old
			}
			t.Logf("round %d: %s leads (fence %d) after %s was %s", r, leader.name, leader.sw.leading.Load(),
				old.name, map[bool]string{true: "cancelled", false: "cut off"}[r%2 == 1])
		}
		// The devices stopped two rounds ago come back.
		if r >= 2 {
			for i := (r - 2) * group; i < (r-1)*group; i++ {
				devs[i] = startDevice(t, st, devs[i].id)
			}
		}
		stopping := devs[r*group : (r+1)*group]
		for _, d := range stopping {
			wantOffline[d.id]++
		}
		stopAndWatch(t, st, stopping)
		if healAfter != nil {
			if f := healAfter.sw.leading.Load(); f != 0 {
				t.Errorf("the cut-off sweeper %s still thinks it leads (fence %d)", healAfter.name, f)
			}
			healAfter.proxy.Heal(t)
		}
		if t.Failed() {
			return
		}
	}

	// Let the sweeps go on a little: a duplicate would show now.
	time.Sleep(3 * sweepInterval)

	// The terms never overlapped: each sweeper's lease context had ended
	// before the next was elected, the cut-off ones' included.
	var terms []term
	for _, in := range ins {
		terms = append(terms, in.sw.history()...)
	}
	slices.SortFunc(terms, func(a, b term) int { return cmp.Compare(a.fence, b.fence) })
	for i := 1; i < len(terms); i++ {
		prev, cur := terms[i-1], terms[i]
		if prev.ended.IsZero() || !prev.ended.Before(cur.elected) {
			t.Errorf("term of fence %d (ended %v) overlaps term of fence %d (elected %v)",
				prev.fence, prev.ended.Format("15:04:05.000"), cur.fence, cur.elected.Format("15:04:05.000"))
		}
	}
	if len(terms) < rounds {
		t.Errorf("%d terms, want at least %d", len(terms), rounds)
	}

	evs, err := st.events(t.Context(), "0", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	offline := map[string]int{}
	lastKind := map[string]string{}
	var lastFence uint64
	for _, e := range evs {
		if e.Kind == lastKind[e.Device] {
			t.Errorf("%s: two %q events in a row", e.Device, e.Kind)
		}
		if lastKind[e.Device] == "" && e.Kind != eventOnline {
			t.Errorf("%s: first event is %q", e.Device, e.Kind)
		}
		lastKind[e.Device] = e.Kind
		if e.Kind == eventOffline {
			offline[e.Device]++
			if e.Fence < lastFence {
				t.Errorf("%s: offline event with fence %d after fence %d", e.Device, e.Fence, lastFence)
			}
			lastFence = e.Fence
		}
	}
	var wantOnline []string
	for _, d := range devs {
		if offline[d.id] != wantOffline[d.id] {
			t.Errorf("%s: %d offline events, want %d", d.id, offline[d.id], wantOffline[d.id])
		}
		if !d.stopped() {
			wantOnline = append(wantOnline, d.id)
		}
	}
	online, err := st.online(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(sorted(online), wantOnline) {
		t.Errorf("online = %v, want %v", online, wantOnline)
	}
	t.Logf("%d devices, %d rounds, %d terms, %d events, %d offline", devices, rounds, len(terms), len(evs), total(offline))
}

// total returns the sum of the counts.
func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestStaleSweeperRefused checks the fence on the offline write: once a
// sweeper with a newer fence has written, an older one is refused and
// publishes nothing, even for a device that has expired.
func TestStaleSweeperRefused(t *testing.T) {
	srv := testserver.StartRedis(t)
	st := &store{rdb: srv.Client(t), fleet: "stale", ttl: 50 * time.Millisecond}
	ctx := t.Context()
	for _, id := range []string{"a", "b"} {
		if _, err := st.heartbeat(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if ok, err := st.markOffline(ctx, 7, "a"); err != nil || !ok {
		t.Fatalf("markOffline(fence 7, a) = %v, %v; want true, nil", ok, err)
	}
	if ok, err := st.markOffline(ctx, 6, "b"); err == nil || ok {
		t.Fatalf("markOffline(fence 6, b) = %v, %v; want a stale-sweeper error", ok, err)
	}
	if ok, err := st.markOffline(ctx, 7, "a"); err != nil || ok {
		t.Fatalf("second markOffline(fence 7, a) = %v, %v; want false, nil", ok, err)
	}
	evs, err := st.events(ctx, "0", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, e.Device+":"+e.Kind)
	}
	if want := []string{"a:online", "b:online", "a:offline"}; !slices.Equal(kinds, want) {
		t.Errorf("events = %v, want %v", kinds, want)
	}
}

// An absence shorter than the time to the next sweep (the key expired and
// came back with no sweep between) is announced all the same: one
// "offline" and one "online" event, in that order, and no second "offline"
// from a sweep that comes later.
func TestShortAbsenceAnnounced(t *testing.T) {
	srv := testserver.StartRedis(t)
	st := &store{rdb: srv.Client(t), fleet: "short", ttl: 50 * time.Millisecond}
	ctx := t.Context()
	if _, err := st.heartbeat(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if ok, err := st.markOffline(ctx, 3, "b"); err != nil || ok { // a sweep with fence 3, before the absence
		t.Fatalf("markOffline(3, b) = %v, %v; want false, nil", ok, err)
	}
	for { // absent: wait until its key has expired
		n, err := st.rdb.Exists(ctx, st.deviceKey("a")).Result()
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	// From here on a stays online: a TTL this short could expire again
	// between the calls below on a loaded machine.
	st.ttl = time.Minute
	back, err := st.heartbeat(ctx, "a")
	if err != nil || !back {
		t.Fatalf("heartbeat after the absence = %v, %v; want came online", back, err)
	}
	if again, err := st.heartbeat(ctx, "a"); err != nil || again {
		t.Fatalf("heartbeat while online = %v, %v; want not came online", again, err)
	}
	if ok, err := st.markOffline(ctx, 3, "a"); err != nil || ok {
		t.Fatalf("a sweep after the absence ended = %v, %v; want nothing published", ok, err)
	}
	evs, err := st.events(ctx, "0", 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var kinds []string
	for _, e := range evs {
		kinds = append(kinds, fmt.Sprintf("%s:%s:%d", e.Device, e.Kind, e.Fence))
	}
	if want := []string{"a:online:0", "a:offline:3", "a:online:0"}; !slices.Equal(kinds, want) {
		t.Errorf("events = %v, want %v", kinds, want)
	}
}

func sorted(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return s
}
