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
	goleak.VerifyTestMain(m, goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"))
}
