package testserver

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/sirupsen/logrus"
)

// Names of the toxics a Proxy adds; one of each at most.
const (
	toxicLatency       = "latency"
	toxicLateRequests  = "latency-up"
	toxicDropRequests  = "partition-up"
	toxicDropResponses = "partition-down"
)

// quietToxiproxy sends toxiproxy's log (logrus's standard logger, which it
// writes to for every connection it accepts or loses) nowhere, so that a
// failing test's output shows the test's messages rather than the proxy's.
var quietToxiproxy = sync.OnceFunc(func() { logrus.SetOutput(io.Discard) })

// Proxy is a TCP proxy owned by one test, between the test's clients and a
// server, that can fail the way a network fails: refuse connections (Down),
// swallow everything without an answer (Partition), or answer late
// (Latency). It runs inside the test process on toxiproxy's proxy engine, on
// a free loopback port, and is removed when the test ends. Its methods must
// be called from the test's goroutine, as they may fail the test.
type Proxy struct {
	proxy    *toxiproxy.Proxy
	addr     string
	upstream string

	mu          sync.Mutex
	partitioned bool
	latency     time.Duration
	lateReqs    bool
}

// StartProxy starts a proxy to upstream ("host:port") on a free loopback
// port (freePort: Up binds it again) and removes it in t.Cleanup, closing
// every connection through it.
func StartProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	quietToxiproxy()
	p := toxiproxy.NewProxy()
	p.Name = t.Name() + " -> " + upstream
	p.Upstream = upstream
	var err error
	for range 3 { // the port may be taken between freePort and Start
		p.Listen = fmt.Sprintf("127.0.0.1:%d", freePort(t))
		if err = p.Start(); err == nil {
			break
		}
	}
	if err != nil {
		t.Fatalf("start proxy to %s: %v", upstream, err)
	}
	px := &Proxy{proxy: p, addr: p.Listen, upstream: upstream}
	t.Cleanup(p.Stop)
	return px
}

// Addr returns the address clients connect to, "127.0.0.1:PORT". It stays
// the same across Down and Up.
func (p *Proxy) Addr() string { return p.addr }

// Upstream returns the address of the server behind the proxy.
func (p *Proxy) Upstream() string { return p.upstream }

// Down takes the proxy off the network, as a crashed host or a closed port
// would be: the connections through it are closed and new ones are refused
// until Up. The server behind it keeps running and keeps its data. Down does
// nothing when the proxy is already down.
func (p *Proxy) Down(t testing.TB) {
	t.Helper()
	p.proxy.Stop()
}

// Up puts the proxy back on its address after Down; partitions and latency
// set before still apply. It fails the test when the port has been taken
// meanwhile, and does nothing when the proxy is up.
func (p *Proxy) Up(t testing.TB) {
	t.Helper()
	if err := p.proxy.Start(); err != nil && err != toxiproxy.ErrProxyAlreadyStarted {
		t.Fatalf("proxy %s up: %v", p.addr, err)
	}
}

// Partition cuts the proxy off without closing anything, as a network
// partition or a frozen host would: connections, open or new, are accepted
// and kept, but no byte passes in either direction, so requests never reach
// the server and nothing is answered; clients see only their own timeouts.
// It does nothing when the proxy is already partitioned.
func (p *Proxy) Partition(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.partitioned {
		return
	}
	// A "timeout" toxic with timeout 0 drops what it reads and never
	// closes the connection. Requests are dropped on the way up so the
	// server does not act on them, and answers on the way down so that
	// none sent before the partition gets through.
	p.addToxic(t, toxicDropRequests, "timeout", "upstream", `{"timeout": 0}`)
	p.addToxic(t, toxicDropResponses, "timeout", "downstream", `{"timeout": 0}`)
	p.partitioned = true
}

// Heal ends a Partition. Toxiproxy closes the connections that were open
// during the partition as it heals (their streams lost bytes, so they could
// not be trusted anyway); clients reconnect. It does nothing when the proxy
// is not partitioned.
func (p *Proxy) Heal(t testing.TB) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.partitioned {
		return
	}
	p.removeToxic(t, toxicDropRequests)
	p.removeToxic(t, toxicDropResponses)
	p.partitioned = false
}

// Latency delays every answer from the server by d, so each request and
// response round trip takes d longer; requests sent back to back are
// delayed together, not one after the other. It replaces an earlier
// Latency; d <= 0 is ClearLatency.
func (p *Proxy) Latency(t testing.TB, d time.Duration) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.latency > 0 {
		p.removeToxic(t, toxicLatency)
		p.latency = 0
	}
	if d <= 0 {
		return
	}
	ms := d.Milliseconds()
	if ms == 0 {
		t.Fatalf("proxy %s: latency %v is below toxiproxy's resolution of 1ms", p.addr, d)
	}
	p.addToxic(t, toxicLatency, "latency", "downstream", fmt.Sprintf(`{"latency": %d}`, ms))
	p.latency = d
}

// ClearLatency removes the delay set by Latency; answers held back by it are
// delivered at once.
func (p *Proxy) ClearLatency(t testing.TB) {
	t.Helper()
	p.Latency(t, 0)
}

// RequestLatency delays every request on its way to the server by d ± jitter
// (each chunk of bytes drawn afresh, in [d−jitter, d+jitter]); answers are
// not delayed. Requests on one connection keep their order, but a request
// sent later on another connection can overtake one still on its way: a
// clean-up sent after its caller gave up can land before the request it
// cleans up. It replaces an earlier RequestLatency; d <= 0 removes it.
func (p *Proxy) RequestLatency(t testing.TB, d, jitter time.Duration) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.lateReqs {
		p.removeToxic(t, toxicLateRequests)
		p.lateReqs = false
	}
	if d <= 0 {
		return
	}
	if d.Milliseconds() == 0 {
		t.Fatalf("proxy %s: latency %v is below toxiproxy's resolution of 1ms", p.addr, d)
	}
	p.addToxic(t, toxicLateRequests, "latency", "upstream",
		fmt.Sprintf(`{"latency": %d, "jitter": %d}`, d.Milliseconds(), min(jitter, d).Milliseconds()))
	p.lateReqs = true
}

// addToxic adds a toxic of type typ to the direction stream ("upstream" is
// client to server). p.mu must be held.
func (p *Proxy) addToxic(t testing.TB, name, typ, stream, attributes string) {
	t.Helper()
	spec := fmt.Sprintf(`{"name": %q, "type": %q, "stream": %q, "toxicity": 1, "attributes": %s}`,
		name, typ, stream, attributes)
	if _, err := p.proxy.Toxics.AddToxicJson(strings.NewReader(spec)); err != nil {
		t.Fatalf("proxy %s: add %s toxic: %v", p.addr, typ, err)
	}
}

// removeToxic removes the toxic called name. p.mu must be held.
func (p *Proxy) removeToxic(t testing.TB, name string) {
	t.Helper()
	if err := p.proxy.Toxics.RemoveToxic(name); err != nil {
		t.Fatalf("proxy %s: remove %s toxic: %v", p.addr, name, err)
	}
}
