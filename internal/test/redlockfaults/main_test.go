package redlockfaults_test

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	// go-redis logs every failed dial; with nodes down on purpose that is
	// thousands of lines that hide the tests' own messages.
	redis.SetLogger(&logging.VoidLogger{})
	// After failing to dial a node that is down, a go-redis pool keeps one
	// goroutine that dials again every second; Close ends it, but only when
	// it wakes up.
	// toxiproxy's links (a latency toxic holding back data) end a moment
	// after their proxy is removed; they are the test rig's, not dlock's.
	goleak.VerifyTestMain(m,
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).Start.func1"),
	)
}
