package testserver

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"testing"
)

// lowestPort is the lowest port freePort hands out.
const lowestPort = 10000

// freePort returns a loopback TCP port that was free a moment ago, below
// the kernel's range of ephemeral ports where it can.
//
// A server that a test stops and starts again (Kill and Start, a member's
// restart, a proxy's Down and Up) binds the same port twice. A port of the
// ephemeral range may meanwhile become the source port of any connection
// that any process on the machine opens, and then bind refuses it
// ("Address already in use"); below that range only listeners take ports,
// and this one picks them at random.
func freePort(t testing.TB) int {
	t.Helper()
	if hi := ephemeralLow(); hi > lowestPort+1000 {
		for range 100 {
			port := lowestPort + rand.IntN(hi-lowestPort)
			l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
			if err == nil {
				_ = l.Close()
				return port
			}
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("find a free port: %v", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// ephemeralLow returns the first port of the kernel's ephemeral range
// (Linux's ip_local_port_range), or 0 when it cannot be read.
func ephemeralLow() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	var lo, hi int
	if _, err := fmt.Sscan(string(b), &lo, &hi); err != nil {
		return 0
	}
	return lo
}
