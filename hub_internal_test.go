package dlock

import (
	"context"
	"log/slog"
	"testing"

	"github.com/dlock-go/dlock/driver"
)

// TestHandedForgottenWithTheSubscription: a handoff announced for a key
// while its subscription is being dropped (the stream still delivers) is
// not kept: the hub keeps handoffs only for subscribed keys, and forgets
// them with the subscription, so that its memory stays bounded by the keys
// it listens to, not an entry per key ever waited on.
func TestHandedForgottenWithTheSubscription(t *testing.T) {
	h := newWaitHub(nil, slog.New(slog.DiscardHandler), context.Background())
	h.subscribed("k")
	h.notify("k", driver.Handoff{Token: "other", Fence: 7}.Next())
	if _, ok := h.handed["k"]; !ok {
		t.Fatal("a handoff to a token no waiter waits with was not kept for a subscribed key")
	}
	h.dropping("k")
	if _, ok := h.handed["k"]; ok {
		t.Error("kept after the subscription was dropped")
	}
	h.notify("k", driver.Handoff{Token: "other2", Fence: 8}.Next()) // still in flight on the stream
	if len(h.handed) != 0 {
		t.Errorf("kept %v for an unsubscribed key", h.handed)
	}
}
