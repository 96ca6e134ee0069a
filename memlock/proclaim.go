package memlock

import (
	"context"

	"github.com/dlock-go/dlock/driver"
)

var _ driver.Proclaimer = (*Backend)(nil)

// Proclaim implements driver.Proclaimer: it sets the owner of req.Token's
// unexpired exclusive grant with fence req.Fence, when req.Seq is above the
// grant's last applied one.
func (b *Backend) Proclaim(ctx context.Context, req driver.ProclaimRequest) (bool, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if err := b.check(ctx); err != nil {
		return false, err
	}
	now := b.clock.Now()
	st := b.state(req.Key, now)
	if st == nil || st.excl == nil {
		return false, nil
	}
	e := st.excl
	if _, ok := e.holds[req.Token]; !ok || e.expired(now) || (req.Fence != 0 && e.fence != req.Fence) {
		return false, nil
	}
	if req.Seq > e.pseq {
		e.owner, e.pseq = req.Owner, req.Seq
	}
	return true, nil
}
