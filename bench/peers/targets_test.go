package peers_test

import (
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/dlock-go/dlock/bench/peers"
	"github.com/dlock-go/dlock/internal/bench"
)

// TestWriteTargets checks the verdicts of the targets on a report that
// TestCompare wrote (testdata): each ratio, its target and verdict.
func TestWriteTargets(t *testing.T) {
	data, err := os.ReadFile("testdata/compare-13f6ac9.json")
	if err != nil {
		t.Fatal(err)
	}
	var rep bench.Report
	if err := json.Unmarshal(data, &rep); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	if err := peers.WriteTargets(&out, &rep); err != nil {
		t.Fatal(err)
	}
	t.Log(out.String())
	for _, want := range []string{
		// 7008 / 5269 cycles/s
		`dlock uncontended cycle / raw's +1.33 +≤ 1.3 +MISSED`,
		// 3413 / 3766 grants/s
		`dlock-fair headline grants/s / raw's +0.906 +≥ 1 +MISSED`,
		`dlock-fair headline grants/s / redsync's +0.894 +≥ 1 +MISSED`,
		`redsync headline blocked-wait p99 / dlock-fair's +520 +≥ 20 +ok`,
		`redsync-tuned headline blocked-wait p99 / dlock-fair's +\S+ +- *$`,
		`dlock-fair headline Jain +1 +≥ 0.99 +ok`,
		`dlock-fair headline handoff p50 / ping p50 +0 +≤ 2 +ok`,
		// 5512 / 8265 and 5512 / 6569 grants/s
		`dlock-fair CS 0 grants/s / raw's +0.667 +≥ 0.8 +MISSED`,
		`dlock-fair CS 0 grants/s / redsync's +0.839 +≥ 1 +MISSED`,
		`dlock-fair headline commands per grant +45 +≤ 20 +MISSED`,
		`dlock-fair headline script calls per grant +2 +- *$`,
		`dlock headline commands per grant +45 +- *$`,
		`raw headline script calls per grant +1 +- *$`,
		`dlock-pair headline grants/s / raw's +n/a +≥ 1 *$`,
		`dlock headline grants/s / raw's +0.936 +≥ 1 +MISSED`, // 3527 / 3766
		// 586 / 2214 grants/s
		`dlock-redlock3 headline grants/s / redsync-redlock3's +0.265 +≥ 1 +MISSED`,
		`redsync-redlock3 headline blocked-wait p99 / dlock-redlock3's +9.87 +≥ 10 +MISSED`,
	} {
		if !regexp.MustCompile(`(?m)^  ` + want).MatchString(out.String()) {
			t.Errorf("no line matching %q", want)
		}
	}
}

// TestWriteTargetsMissingRows: a report without some subjects shows n/a
// for their ratios, and no verdict.
func TestWriteTargetsMissingRows(t *testing.T) {
	rep := &bench.Report{Results: []bench.Result{
		{Subject: peers.SubjectRaw, Workload: peers.Headline.Label(), Grants: 100, Throughput: 100},
		{Subject: peers.SubjectDlockFair, Workload: peers.Headline.Label(), Grants: 120, Throughput: 120, Jain: 1},
	}}
	var out strings.Builder
	if err := peers.WriteTargets(&out, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`dlock-fair headline grants/s / raw's +1.2 +≥ 1 +ok`,
		`dlock-fair headline grants/s / redsync's +n/a +≥ 1 *$`,
		`dlock uncontended cycle / raw's +n/a +≤ 1.3 *$`,
		`dlock-fair headline handoff p50 / ping p50 +n/a +≤ 2 *$`,
	} {
		if !regexp.MustCompile(`(?m)^  ` + want).MatchString(out.String()) {
			t.Errorf("no line matching %q in\n%s", want, out.String())
		}
	}
}

// TestWriteTargetsKinds: the read-write and semaphore targets compare
// dlock's grants/s with raw's spin of the same shape (≥ 1) and check its
// Jain (≥ 0.99), for dlock and dlock-pair; raw's Jain is shown alone.
func TestWriteTargetsKinds(t *testing.T) {
	rw, sem := peers.RW.Label(), peers.Sem.Label()
	if rw != "rw-8w-2wr-cs100µs" || sem != "sem3-8w-cs100µs" {
		t.Fatalf("labels %q and %q, want rw-8w-2wr-cs100µs and sem3-8w-cs100µs", rw, sem)
	}
	rep := &bench.Report{Results: []bench.Result{
		{Subject: peers.SubjectRaw, Workload: rw, Grants: 1000, Throughput: 1000, Jain: 0.97},
		{Subject: peers.SubjectDlock, Workload: rw, Grants: 1100, Throughput: 1100, Jain: 0.995},
		{Subject: peers.SubjectRaw, Workload: sem, Grants: 1000, Throughput: 1000, Jain: 0.999},
		{Subject: peers.SubjectDlock, Workload: sem, Grants: 900, Throughput: 900, Jain: 0.98},
		{Subject: peers.SubjectDlockPair, Workload: sem, Grants: 1000, Throughput: 1000, Jain: 1},
	}}
	var out strings.Builder
	if err := peers.WriteTargets(&out, rep); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		`dlock rw grants/s / raw's +1.1 +≥ 1 +ok`,
		`dlock rw Jain +0.995 +≥ 0.99 +ok`,
		`dlock-pair rw grants/s / raw's +n/a +≥ 1 *$`,
		`raw rw Jain +0.97 +- *$`,
		`dlock sem grants/s / raw's +0.9 +≥ 1 +MISSED`,
		`dlock sem Jain +0.98 +≥ 0.99 +MISSED`,
		`dlock-pair sem grants/s / raw's +1 +≥ 1 +ok`,
		`dlock-pair sem Jain +1 +≥ 0.99 +ok`,
	} {
		if !regexp.MustCompile(`(?m)^  ` + want).MatchString(out.String()) {
			t.Errorf("no line matching %q in\n%s", want, out.String())
		}
	}
}
