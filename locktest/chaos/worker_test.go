package chaos

import (
	"errors"
	"testing"

	"github.com/dlock-go/dlock"
)

// A lock refused outright took nothing: a conflict of kinds or limits
// (ErrConflict) is a Failed acquire, as a bad argument is, not one whose
// effect on the store is unknown.
func TestLockOutcomeOfRefusals(t *testing.T) {
	for _, err := range []error{
		&dlock.ConflictError{Name: "sem", Permits: 2, HeldPermits: 3},
		&dlock.NotObtainedError{Name: "x"},
		dlock.ErrInvalid,
	} {
		if got := lockOutcome(err); got != Failed {
			t.Errorf("lockOutcome(%v) = %v, want %v", err, got, Failed)
		}
	}
	if got := lockOutcome(errors.New("store down")); got != Unknown {
		t.Errorf("lockOutcome(store error) = %v, want %v", got, Unknown)
	}
}
