package top_test

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock/driver"
	"github.com/dlock-go/dlock/internal/top"
)

func view(order top.Order, infos *[]driver.LockInfo, err *error) *top.View {
	return top.New(top.Config{
		List: func(context.Context) ([]driver.LockInfo, error) { return *infos, *err },
		HeldFor: func(info driver.LockInfo, _ time.Time) (time.Duration, bool) {
			return info.HeldFor, info.HeldFor > 0
		},
		Duration: time.Duration.String,
		Where:    "test",
		Order:    order,
	})
}

// TestOrderAndKinds: rows come longest hold first, or longest-seen wait
// first; kinds and hold counts follow the holds.
func TestOrderAndKinds(t *testing.T) {
	infos := []driver.LockInfo{
		{Key: "short", Owner: "a", Holds: 1, HeldFor: time.Second, TTL: 9 * time.Second},
		{Key: "long", Owner: "b", Holds: 2, HeldFor: time.Minute, TTL: 5 * time.Second},
		{Key: "sem", Shared: []driver.SharedHold{{Owner: "c", TTL: time.Second}, {Owner: "d", TTL: 3 * time.Second}}, Limit: 5},
		{Key: "rw", Shared: []driver.SharedHold{{Owner: "e", TTL: time.Second}}, WriterWaiting: true},
	}
	var err error
	v := view(top.ByHold, &infos, &err)
	rows, _, err2 := v.Sample(t.Context())
	if err2 != nil {
		t.Fatal(err2)
	}
	var names []string
	for _, r := range rows {
		names = append(names, r.Name+":"+r.Kind+":"+r.Holds)
	}
	if got, want := strings.Join(names, " "), "long:exclusive:2 short:exclusive:1 rw:readers:1 sem:permits:2/5"; got != want {
		t.Errorf("by hold: %s, want %s", got, want)
	}
	if rows[3].Holder != "c (+1 more)" || rows[3].ExpiresIn != 3*time.Second {
		t.Errorf("semaphore row: holder %q, expires in %v", rows[3].Holder, rows[3].ExpiresIn)
	}

	w := view(top.ByWait, &infos, &err)
	if _, _, err := w.Sample(t.Context()); err != nil {
		t.Fatal(err)
	}
	infos[0].Queued = 3 // short gains waiters after rw's writer was seen
	time.Sleep(10 * time.Millisecond)
	rows, _, _ = w.Sample(t.Context())
	if rows[0].Name != "rw" || rows[1].Name != "short" || rows[0].WaitingFor < 10*time.Millisecond {
		t.Errorf("by wait: %q (waiting %v) then %q, want rw then short", rows[0].Name, rows[0].WaitingFor, rows[1].Name)
	}
	var buf bytes.Buffer
	if err := w.WriteTable(&buf, rows); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(buf.String(), "3 queued") || !strings.Contains(buf.String(), "writer") {
		t.Errorf("table:\n%s", buf.String())
	}
}

// TestLiveShowsErrorsAndGoesOn: a failed sample is shown on the frame and
// the next one draws the locks.
func TestLiveShowsErrorsAndGoesOn(t *testing.T) {
	infos := []driver.LockInfo{{Key: "x\x1b[2J", Owner: "o", Holds: 1}}
	err := errors.New("store down\x1b]0;t\x07")
	v := view(top.ByHold, &infos, &err)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	var buf bytes.Buffer
	if err := v.Live(ctx, &buf, 50*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	if !strings.Contains(out, `store error: "store down\x1b]0;t\a"`) || strings.Contains(out, "\x1b]0") {
		t.Errorf("the error is not shown escaped: %q", out)
	}
	if !strings.HasPrefix(out, "\x1b[?25l\x1b[2J\x1b[H") || !strings.HasSuffix(out, "\x1b[?25h\n") {
		t.Errorf("frames do not start by clearing and end by showing the cursor: %q", out)
	}
}
