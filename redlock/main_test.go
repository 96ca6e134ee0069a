package redlock_test

import (
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// go-redis redials a node that refused its dial in a goroutine of
		// its pool, which sleeps a second between tries and ends at the
		// first after the client's Close: a test that kills a node may
		// end within that second.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}
