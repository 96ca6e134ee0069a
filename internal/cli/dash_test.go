package cli_test

import (
	"strings"
	"testing"

	"github.com/dlock-go/dlock/internal/test/testserver"
)

// TestDashAllowReleaseNeedsBreakIf: on a store that cannot break a lock on
// condition of its grant (Redlock), dash --allow-release exits 64 at start
// rather than offer a button that would break whoever holds the lock.
func TestDashAllowReleaseNeedsBreakIf(t *testing.T) {
	var addrs []string
	for range 3 {
		addrs = append(addrs, testserver.StartRedis(t).Addr())
	}
	e := newEnv(t, "redlock://"+strings.Join(addrs, ","))
	expect(t, e.run("dash", "--listen", "127.0.0.1:0", "--allow-release"), 64, "--allow-release", "no BreakIf", "dlock release --force")
}
