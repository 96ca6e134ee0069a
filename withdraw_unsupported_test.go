package dlock_test

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// noWithdraw is a wrapper whose inner store cannot withdraw: it returns
// errors.ErrUnsupported itself, not driver.ErrUnsupported.
type noWithdraw struct{ *memlock.Backend }

func (noWithdraw) Withdraw(context.Context, string, string) error { return errors.ErrUnsupported }

// TestWithdrawUnsupportedIsQuiet: a wait of a reentrant fair handle that
// ends on a backend without Withdraw leaves its entry to lapse, as the
// contract allows, without a warning, whether the backend says so with
// errors.ErrUnsupported or driver.ErrUnsupported.
func TestWithdrawUnsupportedIsQuiet(t *testing.T) {
	store := memlock.New()
	ctx := t.Context()
	holder := dlock.New(store)
	defer holder.Close()
	h, err := holder.Mutex("q", dlock.Fair()).Lock(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = h.Unlock(ctx) }()
	var buf bytes.Buffer
	c := dlock.New(noWithdraw{store}, dlock.WithLogger(slog.New(slog.NewTextHandler(&buf, nil))))
	_, err = c.Mutex("q", dlock.Fair(), dlock.Reentrant(), dlock.WithWait(50*time.Millisecond)).Lock(ctx)
	if !errors.Is(err, dlock.ErrNotObtained) {
		t.Fatalf("Lock: %v, want ErrNotObtained", err)
	}
	if err := c.Close(); err != nil { // waits for the withdrawal
		t.Fatal(err)
	}
	if strings.Contains(buf.String(), "leaving the queue failed") {
		t.Errorf("warned for a backend without Withdraw: %s", buf.String())
	}
}
