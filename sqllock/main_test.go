package sqllock_test

import (
	"io"
	"log"
	"os"
	"testing"

	"github.com/go-sql-driver/mysql"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(runChild()) // a process of TestSQLiteAcrossProcesses
	}
	if os.Getenv(wakeChildEnv) != "" {
		os.Exit(runWakeChild()) // the waiter of TestSQLiteWakeAcrossProcesses
	}
	// The driver logs every connection that a server restart broke.
	_ = mysql.SetLogger(log.New(io.Discard, "", 0))
	goleak.VerifyTestMain(m)
}
