package main

import (
	"strings"
	"testing"
	"time"
)

// The printed report gives throughput relative to the lua strategy
// whichever ran first, explains its columns, and ends with a verdict that
// names a strategy that broke an invariant.
func TestPrintReportsReferenceAndVerdict(t *testing.T) {
	mutex := &report{Strategy: strategyMutex, Throughput: 100, P50: time.Millisecond, P99: time.Second}
	lua := &report{Strategy: strategyLua, Throughput: 300, P50: time.Millisecond, P99: time.Second}
	var b strings.Builder
	printReports(&b, []*report{mutex, lua})
	out := b.String()
	for _, want := range []string{"vs lua", " 0.33 ", " 1.00 ", "must be 0:", "verdict: PASS"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	for _, line := range strings.Split(out, "\n") {
		if len(line) > 120 {
			t.Errorf("line of %d columns, want at most 120: %q", len(line), line)
		}
	}

	mutex.Oversold = 1
	b.Reset()
	printReports(&b, []*report{mutex, lua})
	if out := b.String(); !strings.Contains(out, "verdict: FAIL: mutex") {
		t.Errorf("an oversold run is not named in the verdict:\n%s", out)
	}
}

// A run that cannot be made (MariaDB unreachable) prints its error and a
// verdict, not an empty table.
func TestRunWithoutMariaDBPrintsNoTable(t *testing.T) {
	var out strings.Builder
	code := runMain([]string{"-redis", "127.0.0.1:1", "-mysql", "root@tcp(127.0.0.1:1)/none", "-strategy", "lua"}, &out)
	if code == 0 {
		t.Errorf("exit code 0 without MariaDB")
	}
	if strings.Contains(out.String(), "strategy") || !strings.Contains(out.String(), "verdict: FAIL") {
		t.Errorf("output without MariaDB:\n%s\nwant a verdict and no table", out.String())
	}
}
