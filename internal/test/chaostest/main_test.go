package chaostest

import (
	"flag"
	"io"
	"log"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/logging"
	"go.uber.org/goleak"
)

var (
	soak = flag.Bool("chaos.soak", false,
		"run every scenario long: at least 10,000 critical sections each (default: a few seconds each)")
	outDir = flag.String("chaos.out", "",
		"directory for the history and report of failed runs (default: a new directory under the system's temporary directory, kept)")
)

func TestMain(m *testing.M) {
	if isChild, code := childMain(); isChild {
		os.Exit(code)
	}
	// go-redis logs every failed dial and the MySQL driver every broken
	// connection; with stores cut off on purpose that is thousands of
	// lines that hide the tests' own messages.
	redis.SetLogger(&logging.VoidLogger{})
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	goleak.VerifyTestMain(summarized{m},
		// After failing to dial a server that is down, a go-redis pool
		// keeps one goroutine that dials again every second; Close ends
		// it, but only when it wakes up.
		goleak.IgnoreAnyFunction("github.com/redis/go-redis/v9/internal/pool.(*ConnPool).tryDial"),
		// toxiproxy's links end a moment after their proxy is removed;
		// they are the test rig's, not dlock's.
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2/toxics.(*ToxicStub).Run"),
		goleak.IgnoreAnyFunction("github.com/Shopify/toxiproxy/v2.(*ToxicLink).Start.func1"),
	)
}

// summarized runs the tests and then prints the summary of the scenarios
// and stops the servers they shared, before goleak looks for leaks.
type summarized struct{ m *testing.M }

func (s summarized) Run() int {
	code := s.m.Run()
	printSummary()
	stopShared()
	return code
}
