package otel_test

import (
	"context"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/dlock-go/dlock/memlock"
)

// TestDoSpanEndsOnPanic: a Do whose fn panics (recovered by the
// caller, as net/http does) must still end its dlock.Do span, with an
// error status; today the span is never ended, so never exported.
func TestDoSpanEndsOnPanic(t *testing.T) {
	obs, spans, _, _ := setup(t)
	c := dlock.New(memlock.New(), dlock.WithObserver(obs))
	defer c.Close()
	func() {
		defer func() { _ = recover() }()
		_ = c.Do(t.Context(), "orders:1", func(context.Context) error { panic("boom") })
	}()
	got := byName(spans.GetSpans())
	if _, ok := got["dlock.Do"]; !ok {
		t.Errorf("spans %v: no dlock.Do span ended after fn panicked", keys(got))
	}
}

func keys[V any](m map[string]V) []string {
	var ks []string
	for k := range m {
		ks = append(ks, k)
	}
	return ks
}
