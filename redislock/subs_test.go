package redislock_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sort"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/test/testserver"
	"github.com/dlock-go/dlock/redislock"
)

// The listener's UNSUBSCRIBE of a confirmed channel that is not in
// its table (13f6ac9) never takes away the server-side channel of a live
// Subscribe or Watch. Workers Subscribe, Unsubscribe, Watch and Unwatch the
// same few keys concurrently with deadlines of a few µs (failed writes,
// confirmations that arrive after the caller gave up), while another client
// kills the pub/sub connection now and then (go-redis reconnects and
// resubscribes). At each pause, every channel the listener holds must be
// subscribed on the server once, no other channel may be, and a PUBLISH on
// each held channel must reach the callback.
func TestFailedSubscribesKeepLiveChannels(t *testing.T) {
	b, rdb, _ := setup(t)
	h := &heard{}
	l, err := b.Listen(t.Context(), h.fn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	w := l.(driver.HandoffWatcher)
	keys := []string{"a", "b", "c", "d"}
	timeouts := []time.Duration{0, time.Microsecond, 5 * time.Microsecond, 20 * time.Microsecond,
		50 * time.Microsecond, 100 * time.Microsecond, 300 * time.Microsecond, time.Millisecond, 50 * time.Millisecond}

	type held struct{ subs, watches map[string]int }
	const workers = 3
	state := make([]held, workers)
	for i := range state {
		state[i] = held{map[string]int{}, map[string]int{}}
	}
	var badErr sync.Once
	check := func(op, key string, deadline time.Time, err error) {
		// An error wrapping DeadlineExceeded must come after the deadline.
		if errors.Is(err, context.DeadlineExceeded) && time.Now().Before(deadline) {
			badErr.Do(func() { t.Errorf("%s(%s) before its deadline = %v, claims the deadline", op, key, err) })
		}
	}
	for round := range 6 {
		stop := make(chan struct{})
		var wg sync.WaitGroup
		wg.Add(1)
		go func() { // the killer
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Duration(1+rand.IntN(8)) * time.Millisecond):
				}
				_ = rdb.Do(context.Background(), "CLIENT", "KILL", "TYPE", "pubsub").Err()
			}
		}()
		var stats [4]int64 // ok, deadline, other, undo errors
		var smu sync.Mutex
		count := func(i int) { smu.Lock(); stats[i]++; smu.Unlock() }
		end := time.Now().Add(400 * time.Millisecond)
		for wi := range workers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				st := state[wi]
				for time.Now().Before(end) {
					key := keys[rand.IntN(len(keys))]
					watch := rand.IntN(4) == 0
					m, sub, unsub := st.subs, l.Subscribe, l.Unsubscribe
					if watch {
						m, sub, unsub = st.watches, w.Watch, w.Unwatch
					}
					if m[key] > 0 {
						// Unsubscribe with no deadline: a failed
						// Unsubscribe would leave the count unknown.
						// Its write may fail on a killed connection;
						// the subscription is dropped all the same.
						if err := unsub(context.Background(), key); err != nil {
							count(3)
						}
						m[key]--
						continue
					}
					d := timeouts[rand.IntN(len(timeouts))]
					ctx, cancel := context.WithTimeout(context.Background(), d)
					dl, _ := ctx.Deadline()
					err := sub(ctx, key)
					cancel()
					switch {
					case err == nil:
						m[key]++
						count(0)
					case errors.Is(err, context.DeadlineExceeded):
						count(1)
					default:
						count(2)
					}
					check("subscribe", key, dl, err)
				}
			}()
		}
		time.Sleep(time.Until(end))
		close(stop)
		wg.Wait()
		t.Logf("round %d: %s; %d ok, %d deadline, %d other errors, %d failed undos", round, cmdstats(t, rdb), stats[0], stats[1], stats[2], stats[3])

		// The expected channels.
		want := map[string]bool{}
		for _, st := range state {
			for k, n := range st.subs {
				if n > 0 {
					want["dlock:{"+k+"}:rel"] = true
					want[redislock.HandoffChannel(b, k)] = true
				}
			}
			for k, n := range st.watches {
				if n > 0 {
					want["dlock:{"+k+"}:ho:rel"] = true
				}
			}
		}
		// The listener is back (the probe waits for a confirmation).
		// (Its first write may meet the last killed connection.)
		for i := 0; ; i++ {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			err := l.Subscribe(ctx, "probe")
			cancel()
			if err == nil {
				break
			}
			if i == 5 {
				t.Fatal(err)
			}
		}
		if err := l.Unsubscribe(t.Context(), "probe"); err != nil {
			t.Fatal(err)
		}
		var last string
		deadline := time.Now().Add(5 * time.Second)
		for {
			chs, err := rdb.PubSubChannels(t.Context(), "*").Result()
			if err != nil {
				t.Fatal(err)
			}
			sort.Strings(chs)
			var missing, extra []string
			for ch := range want {
				if !slices.Contains(chs, ch) {
					missing = append(missing, ch)
				}
			}
			for _, ch := range chs {
				if !want[ch] {
					extra = append(extra, ch)
				}
			}
			last = fmt.Sprintf("missing %q, extra %q", missing, extra)
			if len(missing) == 0 && len(extra) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: server channels vs held: %s", round, last)
			}
			time.Sleep(10 * time.Millisecond)
		}
		// Each held channel has one subscriber and reaches the callback.
		for ch := range want {
			n, err := rdb.PubSubNumSub(t.Context(), ch).Result()
			if err != nil {
				t.Fatal(err)
			}
			if n[ch] != 1 {
				t.Errorf("round %d: NUMSUB %s = %d, want 1", round, ch, n[ch])
			}
			tok := fmt.Sprintf("r%d-%s", round, ch)
			if got, err := rdb.Publish(t.Context(), ch, "next:"+tok).Result(); err != nil || got != 1 {
				t.Errorf("round %d: PUBLISH %s reached %d (%v), want 1", round, ch, got, err)
			}
			waitHeardSuffix(t, h, " "+tok)
		}
		if t.Failed() {
			return
		}
	}
	// Undo everything: no channel is left.
	for _, st := range state {
		for k, n := range st.subs {
			for range n {
				if err := l.Unsubscribe(t.Context(), k); err != nil {
					t.Fatal(err)
				}
			}
		}
		for k, n := range st.watches {
			for range n {
				if err := w.Unwatch(t.Context(), k); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	noChannelLeft(t, rdb, "no channel left")
}

func waitHeardSuffix(t *testing.T, h *heard, suffix string) {
	t.Helper()
	if !h.within(2*time.Second, func(m string) bool { return strings.HasSuffix(m, suffix) }) {
		t.Errorf("no message ending %q heard", suffix)
	}
}

// cmdstats returns the server's SUBSCRIBE and UNSUBSCRIBE counts so far.
func cmdstats(t *testing.T, rdb *redis.Client) string {
	info, err := rdb.Info(t.Context(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, line := range strings.Split(info, "\n") {
		if strings.HasPrefix(line, "cmdstat_subscribe:") || strings.HasPrefix(line, "cmdstat_unsubscribe:") {
			out = append(out, strings.SplitN(strings.TrimSpace(line), ",usec=", 2)[0])
		}
	}
	return strings.Join(out, " ")
}

// Close while the receive goroutine unsubscribes the channels of
// failed Subscribes that go-redis subscribed again after a reconnect (l.mu
// held, writing on the pub/sub connection) neither deadlocks nor stalls,
// and leaves no goroutine (TestMain's goleak) and no channel behind.
func TestCloseDuringStaleUnsubscribes(t *testing.T) {
	b, rdb, _ := setup(t)
	var worst time.Duration
	for i := range 30 {
		l, err := b.Listen(t.Context(), func(string, string) {})
		if err != nil {
			t.Fatal(err)
		}
		subscribe(t, l, "warm")
		var wg sync.WaitGroup
		for g := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for j := range 100 {
					ctx, cancel := context.WithTimeout(context.Background(), time.Duration(j%4)*time.Microsecond)
					if l.Subscribe(ctx, fmt.Sprint("k", g, "-", j)) == nil {
						_ = l.Unsubscribe(context.Background(), fmt.Sprint("k", g, "-", j))
					}
					cancel()
				}
			}()
		}
		wg.Wait()
		// Reconnect: go-redis resubscribes every failed channel, and the
		// listener unsubscribes them as their confirmations come in.
		_ = rdb.Do(t.Context(), "CLIENT", "KILL", "TYPE", "pubsub").Err()
		time.Sleep(time.Duration(rand.IntN(40)) * time.Millisecond)
		start := time.Now()
		done := make(chan error, 1)
		go func() { done <- l.Close() }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("iteration %d: Close has not returned after 10s", i)
		}
		worst = max(worst, time.Since(start))
	}
	t.Logf("slowest Close: %v", worst)
	if worst > time.Second {
		t.Errorf("slowest Close took %v", worst)
	}
	noChannelLeft(t, rdb, "no channel left")
}

// A Subscribe that fails before its deadline, for another reason
// than the deadline, does not claim the deadline; one whose context was
// cancelled wraps context.Canceled and not DeadlineExceeded.
func TestSubscribeErrorNamesItsCause(t *testing.T) {
	b, _, srv := setup(t)
	l, err := b.Listen(t.Context(), func(string, string) {})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	subscribe(t, l, "warm")

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err = l.Subscribe(ctx, "cancelled")
	if !errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Subscribe with a cancelled context = %v, want Canceled alone", err)
	}

	srv.Stop(t)
	for i := range 3 {
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Second)
		start := time.Now()
		err := l.Subscribe(ctx, fmt.Sprint("down", i))
		cancel()
		t.Logf("Subscribe with Redis down: %v after %v", err, time.Since(start).Round(time.Millisecond))
		if err == nil {
			t.Fatal("Subscribe with Redis down succeeded")
		}
		if errors.Is(err, context.DeadlineExceeded) && time.Since(start) < 2*time.Second {
			t.Errorf("Subscribe failed before its deadline with %v, claiming the deadline", err)
		}
	}
}

// failingConn is a client connection whose write of UNSUBSCRIBE for a
// channel containing match, once armed, finds the connection dead: before
// failing it, the hook runs (a PUBLISH that the dying connection then loses).
type failingConn struct {
	net.Conn
	fail *failWrite
}

type failWrite struct {
	mu    sync.Mutex
	match string
	hook  func()
	fired bool // the write was matched
	done  bool // and the hook has run
}

func (c *failingConn) Write(p []byte) (int, error) {
	f := c.fail
	f.mu.Lock()
	hit := f.match != "" && !f.fired && bytes.Contains(bytes.ToLower(p), []byte("unsubscribe")) && bytes.Contains(p, []byte(f.match))
	if hit {
		f.fired = true
	}
	f.mu.Unlock()
	if hit {
		f.hook()
		f.mu.Lock()
		f.done = true
		f.mu.Unlock()
		_ = c.Conn.Close()
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return c.Conn.Write(p)
}

// The UNSUBSCRIBE that confirmed now writes from the
// receive goroutine can meet a connection that has just died. go-redis then
// reconnects and resubscribes inside that write, and the receive goroutine
// goes on reading the new connection without ever seeing an error: fn is
// not called with ("", ""), so a release published while the old
// connection was dying is neither heard nor announced as possibly missed
// (the waiter is left to its retry timer).
func TestReconnectInsideStaleUnsubscribeIsAnnounced(t *testing.T) {
	srv := testserver.StartRedis(t)
	admin := srv.Client(t)
	fw := &failWrite{}
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr(), Dialer: func(ctx context.Context, network, addr string) (net.Conn, error) {
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &failingConn{Conn: c, fail: fw}, nil
	}})
	defer rdb.Close()
	b := redislock.New(rdb)
	h := &heard{}
	l, err := b.Listen(t.Context(), h.fn)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	subscribe(t, l, "warm")

	var before int
	fw.mu.Lock()
	fw.match = "{stale}"
	fw.hook = func() {
		// A release of warm while the connection dies.
		before = len(h.all())
		if n, err := admin.Publish(context.Background(), "dlock:{warm}:rel", "next:lost").Result(); err != nil || n != 1 {
			t.Errorf("PUBLISH reached %d (%v), want 1", n, err)
		}
	}
	fw.mu.Unlock()
	// A Subscribe whose SUBSCRIBE write fails: go-redis keeps its channel,
	// resubscribes it after reconnecting, and the listener unsubscribes it.
	ctx, cancel := context.WithTimeout(t.Context(), time.Nanosecond)
	time.Sleep(time.Millisecond)
	if err := l.Subscribe(ctx, "stale"); err == nil {
		t.Fatal("Subscribe with an expired deadline succeeded")
	}
	cancel()
	eventually(t, "the stale channel's UNSUBSCRIBE is written", func() bool {
		fw.mu.Lock()
		defer fw.mu.Unlock()
		return fw.done
	})
	// The listener either heard the release or says releases may have
	// been missed.
	time.Sleep(500 * time.Millisecond)
	msgs := h.all()
	for _, m := range msgs[before:] {
		if m == "warm lost" || m == " " {
			return
		}
	}
	t.Errorf("after the connection died under the stale UNSUBSCRIBE, heard only %q: the release was lost and fn(\"\", \"\") was not called", msgs[before:])
	// The listener still works on the new connection.
	if n, err := admin.Publish(t.Context(), "dlock:{warm}:rel", "next:later").Result(); err != nil || n != 1 {
		t.Errorf("PUBLISH on the new connection reached %d (%v), want 1", n, err)
	}
	waitHeardSuffix(t, h, " later")
}
